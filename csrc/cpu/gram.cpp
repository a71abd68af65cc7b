// The n < D route of the proxies: second moments from the n x n Gram matrix of the centred rows
// instead of the D x D covariance (n^2 D instead of 2 n D^2 flops for the products, an n x n
// instead of a D x D factorisation), and the pair quotients from its regularised inverse factor.
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "blas.hpp"
#include "kernels.hpp"
#include "nvtx.hpp"

namespace dihal {
namespace {

template <typename T, typename W>
void centred_gram_in(const T* X, int64_t n, int64_t D, double* G) {
  std::vector<double> mean(size_t(D), 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) mean[size_t(c)] += double(X[r * D + c]);
  for (double& m : mean) m /= double(n);
  std::vector<W> Xc(size_t(n) * size_t(D)), Gw(size_t(n) * size_t(n));
#pragma omp parallel for schedule(static) if(parallel_worth(double(n) * double(D)))
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) Xc[size_t(r * D + c)] = W(double(X[r * D + c]) - mean[size_t(c)]);
  // Upper-triangle tiles of Xc Xc^T on the OpenMP threads.
  constexpr int64_t B = 256;
  const int64_t nb = (n + B - 1) / B;
#pragma omp parallel for schedule(dynamic, 1) if(parallel_worth(double(n) * double(n) * double(D)))
  for (int64_t t = 0; t < nb * (nb + 1) / 2; ++t) {
    int64_t I = 0, rest = t;  // t-th tile (I, J), J >= I, row by row
    while (rest >= nb - I) rest -= nb - I++;
    const int64_t J = I + rest, i0 = I * B, j0 = J * B;
    const int64_t ni = std::min(B, n - i0), nj = std::min(B, n - j0);
    blas::gemm_abt(int(ni), int(nj), int(D), Xc.data() + i0 * D, Xc.data() + j0 * D, Gw.data() + i0 * n + j0, int(n));
  }
#pragma omp parallel for schedule(static) if(parallel_worth(double(n) * double(n)))
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = a; b < n; ++b) G[a * n + b] = G[b * n + a] = double(Gw[size_t(a * n + b)]);
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
  int info = parallel_cholesky(L.data(), n);
  if (info == 0) info = scipy_LAPACKE_dtrtri(LAPACK_ROW_MAJOR, 'L', 'N', int(n), L.data(), int(n));
  if (info != 0)
    throw std::invalid_argument("regularised Gram matrix is not positive definite (LAPACK info=" + std::to_string(info) + ")");
  // Row i of Winv^T is column i of L^-1 (non-zero from position i on): contiguous per pair.
  std::vector<double> Wt(size_t(n) * size_t(n), 0.0);
#pragma omp parallel for schedule(static) if(parallel_worth(double(n) * double(n)))
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = i; r < n; ++r) Wt[size_t(i * n + r)] = L[size_t(r * n + i)];
#pragma omp parallel for schedule(static) if(parallel_worth(double(n_pairs) * double(D + n)))
  for (int64_t p = 0; p < n_pairs; ++p) {
    const int64_t i = pi[p], j = pj[p];
    const T* xi = X + i * D;
    const T* xj = X + j * D;
    double den = 0.0;
    for (int64_t c = 0; c < D; ++c) {
      const double d = double(xi[c]) - double(xj[c]);
      den += d * d;
    }
    const double* wi = Wt.data() + i * n;
    const double* wj = Wt.data() + j * n;
    double s = 0.0;
    for (int64_t r = std::min(i, j); r < n; ++r) {
      const double d = wi[r] - wj[r];
      s += d * d;
    }
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
