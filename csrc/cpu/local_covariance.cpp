// Local curvature kernel: for each row, the top eigenvalue of the covariance of its k-NN
// neighbourhood (the row and its k neighbours, centred at their mean, normalised by k + 1),
// computed from the (k+1) x (k+1) Gram matrix, never from a D x D matrix.
#include <omp.h>

#include <vector>

#include "blas.hpp"
#include "kernels.hpp"

namespace dihal {

template <typename T>
void local_top_eigenvalues(const T* X, int64_t n, int64_t D, const int64_t* idx, int64_t k, double* out) {
  const int m = int(k + 1);
  blas::SingleThreadedBlas single;
#pragma omp parallel
  {
    std::vector<double> C(size_t(m) * size_t(D)), G(size_t(m) * size_t(m)), mean(D);
#pragma omp for schedule(dynamic, 8)
    for (int64_t i = 0; i < n; ++i) {
      std::fill(mean.begin(), mean.end(), 0.0);
      for (int a = 0; a < m; ++a) {
        const int64_t row = a == 0 ? i : idx[i * k + (a - 1)];
        const T* x = X + row * D;
        double* c = C.data() + size_t(a) * size_t(D);
        for (int64_t j = 0; j < D; ++j) {
          c[j] = double(x[j]);
          mean[j] += c[j];
        }
      }
      for (int64_t j = 0; j < D; ++j) mean[j] /= double(m);
      for (int a = 0; a < m; ++a) {
        double* c = C.data() + size_t(a) * size_t(D);
        for (int64_t j = 0; j < D; ++j) c[j] -= mean[j];
      }
      scipy_cblas_dsyrk(CblasRowMajor, CblasUpper, CblasNoTrans, m, int(D), 1.0, C.data(), int(D), 0.0, G.data(), m);
      for (int a = 0; a < m; ++a)
        for (int b = a + 1; b < m; ++b) G[size_t(b * m + a)] = G[size_t(a * m + b)];
      out[i] = top_eigenvalue_small(G.data(), m) / double(m);
    }
  }
}

template void local_top_eigenvalues<float>(const float*, int64_t, int64_t, const int64_t*, int64_t, double*);
template void local_top_eigenvalues<double>(const double*, int64_t, int64_t, const int64_t*, int64_t, double*);

}  // namespace dihal
