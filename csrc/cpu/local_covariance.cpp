// Local curvature kernel: for each row, the top eigenvalue of the covariance of its k-NN
// neighbourhood (the row and its k neighbours, centred at their mean, normalised by k + 1),
// computed from the (k+1) x (k+1) Gram matrix, never from a D x D matrix.
#include <cstddef>
#include <vector>

#include "blas.hpp"
#include "kernels.hpp"
#include "nvtx.hpp"

namespace dihal {
using std::size_t;
namespace {

// The neighbourhood is shifted by its own point x_i (exact in float64, then rounded to W), so the
// Gram matrix G = C C^T (one GEMM in W) holds local-scale values; centring at the neighbourhood
// mean is then algebraic and in float64: Gc = G - r 1^T - 1 r^T + s, r = row means of G, s = mean r.
template <typename T, typename W>
void local_top_eigenvalues_in(const T* X, int64_t n, int64_t D, const int64_t* idx, int64_t k, double* out) {
  const int m = int(k + 1);
#pragma omp parallel if(parallel_worth(double(n) * double(m) * double(m) * double(D)))
  {
    std::vector<W> C(size_t(m) * size_t(D)), G(size_t(m) * size_t(m));
    std::vector<double> Gc(size_t(m) * size_t(m)), r(static_cast<size_t>(m));
#pragma omp for schedule(dynamic, 8)
    for (int64_t i = 0; i < n; ++i) {
      const T* xi = X + i * D;
      for (int a = 0; a < m; ++a) {
        const T* x = X + (a == 0 ? i : idx[i * k + (a - 1)]) * D;
        W* c = C.data() + size_t(a) * size_t(D);
        for (int64_t j = 0; j < D; ++j) c[j] = W(double(x[j]) - double(xi[j]));
      }
      blas::gemm_abt(m, m, int(D), C.data(), C.data(), G.data(), m);
      double s = 0.0;
      for (int a = 0; a < m; ++a) {
        double row = 0.0;
        for (int b = 0; b < m; ++b) row += double(G[size_t(a * m + b)]);
        r[size_t(a)] = row / m;
        s += row;
      }
      s /= double(m) * double(m);
      for (int a = 0; a < m; ++a)
        for (int b = 0; b < m; ++b)
          Gc[size_t(a * m + b)] = double(G[size_t(a * m + b)]) - r[size_t(a)] - r[size_t(b)] + s;
      out[i] = top_eigenvalue_small(Gc.data(), m) / double(m);
    }
  }
}

}  // namespace

template <typename T>
void local_top_eigenvalues(const T* X, int64_t n, int64_t D, const int64_t* idx, int64_t k, double* out,
                           bool float32_work) {
  DIHAL_NVTX_RANGE("dihal/local_eigen");
  if (float32_work)
    local_top_eigenvalues_in<T, float>(X, n, D, idx, k, out);
  else
    local_top_eigenvalues_in<T, double>(X, n, D, idx, k, out);
}

template void local_top_eigenvalues<float>(const float*, int64_t, int64_t, const int64_t*, int64_t, double*, bool);
template void local_top_eigenvalues<double>(const double*, int64_t, int64_t, const int64_t*, int64_t, double*, bool);

}  // namespace dihal
