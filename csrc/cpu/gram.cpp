// The n < D route of the proxies: second moments from the n x n Gram matrix of the centred rows
// instead of the D x D covariance (n^2 D instead of 2 n D^2 flops for the products, an n x n
// instead of a D x D factorisation), and the pair quotients from its regularised inverse factor.
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "blas.hpp"
#include "kernels.hpp"
#include "nvtx.hpp"

namespace dihal {
namespace {

// Column means of X (n x D) in float64, rows split over the threads.
template <typename T>
std::vector<double> column_means(const T* X, int64_t n, int64_t D) {
  std::vector<double> mean(size_t(D), 0.0);
#pragma omp parallel if(parallel_worth(double(n) * double(D)))
  {
    std::vector<double> local(size_t(D), 0.0);
#pragma omp for schedule(static) nowait
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < D; ++c) local[size_t(c)] += double(X[r * D + c]);
#pragma omp critical
    for (int64_t c = 0; c < D; ++c) mean[size_t(c)] += local[size_t(c)];
  }
  for (double& m : mean) m /= double(n);
  return mean;
}

template <typename T, typename W>
void centred_gram_in(const T* X, int64_t n, int64_t D, double* G) {
  const std::vector<double> mean = column_means(X, n, D);
  std::vector<W> Xc(size_t(n) * size_t(D));
#pragma omp parallel for schedule(static) if(parallel_worth(double(n) * double(D)))
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) Xc[size_t(r * D + c)] = W(double(X[r * D + c]) - mean[size_t(c)]);
  // Upper triangle of Xc Xc^T, straight into G when W is double.
  constexpr bool direct = std::is_same_v<W, double>;
  std::vector<W> Gw(direct ? 0 : size_t(n) * size_t(n));
  W* out = direct ? reinterpret_cast<W*>(G) : Gw.data();
  blas::gram_upper(false, int(n), int(D), Xc.data(), out, int(n));
  constexpr int64_t B = 256;
  const int64_t nb = (n + B - 1) / B;
  // Mirror the upper triangle by B x B blocks (a cache-friendly transpose).
#pragma omp parallel for schedule(dynamic, 1) if(parallel_worth(double(n) * double(n)))
  for (int64_t t = 0; t < nb * (nb + 1) / 2; ++t) {
    int64_t I = 0, rest = t;
    while (rest >= nb - I) rest -= nb - I++;
    const int64_t i0 = I * B, j0 = (I + rest) * B;
    const int64_t i1 = std::min(i0 + B, n), j1 = std::min(j0 + B, n);
    for (int64_t a = i0; a < i1; ++a)
      for (int64_t b = std::max(a, j0); b < j1; ++b) G[b * n + a] = G[a * n + b] = double(out[a * n + b]);
  }
}

}  // namespace

template <typename T>
void centred_gram(const T* X, int64_t n, int64_t D, bool float32_work, double* G) {
  DIHAL_NVTX_RANGE("dihal/covariance");
  if (float32_work)
    centred_gram_in<T, float>(X, n, D, G);
  else
    centred_gram_in<T, double>(X, n, D, G);
}

template <typename T>
void gram_pair_quotients(const T* X, int64_t n, int64_t D, const double* G, double lam, const int64_t* pi,
                         const int64_t* pj, int64_t n_pairs, double* out) {
  DIHAL_NVTX_RANGE("dihal/pairs");
  const double shift = double(n) * lam;
  std::vector<double> L(G, G + n * n);
  for (int64_t a = 0; a < n; ++a) L[size_t(a * n + a)] += shift;
  // Factor and invert in column-major order (K is symmetric, so the memory is the same matrix):
  // row i of the memory then holds column i of L^-1 from position i on, contiguous for the pair
  // sums, with no transposed copies.
  int info = parallel_cholesky(L.data(), n, true);
  if (info == 0) info = scipy_LAPACKE_dtrtri(LAPACK_COL_MAJOR, 'L', 'N', int(n), L.data(), int(n));
  if (info != 0)
    throw std::invalid_argument("regularised Gram matrix is not positive definite (LAPACK info=" + std::to_string(info) + ")");
#pragma omp parallel for schedule(static) if(parallel_worth(double(n_pairs) * double(D + n)))
  for (int64_t p = 0; p < n_pairs; ++p) {
    const int64_t i = std::min(pi[p], pj[p]), j = std::max(pi[p], pj[p]);
    const double den = sqdist_exact(X + i * D, X + j * D, D);
    // Column i of L^-1 is zero above position i, column j above j (the memory there is not).
    const double* wi = L.data() + i * n;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t r = i; r < j; ++r) s += wi[r] * wi[r];
    s += sqdist_exact(wi + j, L.data() + j * n + j, n - j);
    out[p] = den > 0.0 ? double(n) * (2.0 - shift * s) / den : std::numeric_limits<double>::quiet_NaN();
  }
}

template void centred_gram<float>(const float*, int64_t, int64_t, bool, double*);
template void centred_gram<double>(const double*, int64_t, int64_t, bool, double*);
template void gram_pair_quotients<float>(const float*, int64_t, int64_t, const double*, double, const int64_t*,
                                         const int64_t*, int64_t, double*);
template void gram_pair_quotients<double>(const double*, int64_t, int64_t, const double*, double, const int64_t*,
                                          const int64_t*, int64_t, double*);

}  // namespace dihal
