// Monotonicity kernel: factor S + lam I = L L^T once (Cholesky), whiten the rows that occur in
// pairs (Y = X L^-T, one triangular solve), then each pair quotient is ||y_i - y_j||^2 / ||x_i - x_j||^2.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "blas.hpp"
#include "kernels.hpp"
#include "nvtx.hpp"

namespace dihal {

template <typename T>
void pair_quotients(const T* X, int64_t n, int64_t D, const double* mean, const double* S, double lam,
                    const int64_t* pi, const int64_t* pj, int64_t n_pairs, double* out) {
  DIHAL_NVTX_RANGE("dihal/pairs");
  std::vector<double> L(size_t(D) * size_t(D));
  for (int64_t a = 0; a < D; ++a)
    for (int64_t b = 0; b < D; ++b) L[size_t(a * D + b)] = S[a * D + b] + (a == b ? lam : 0.0);
  const int info = scipy_LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', int(D), L.data(), int(D));
  if (info != 0)
    throw std::invalid_argument("regularised covariance is not positive definite (LAPACK dpotrf info=" +
                                std::to_string(info) + ")");

  // Compact the rows that occur in pairs.
  std::vector<int64_t> slot(n, -1), rows;
  for (int64_t p = 0; p < n_pairs; ++p)
    for (int64_t r : {pi[p], pj[p]})
      if (slot[r] < 0) {
        slot[r] = int64_t(rows.size());
        rows.push_back(r);
      }
  const int64_t nr = int64_t(rows.size());
  std::vector<double> Y(size_t(nr) * size_t(D));
#pragma omp parallel for schedule(static) if(parallel_worth(double(nr) * double(D)))
  for (int64_t s = 0; s < nr; ++s)
    for (int64_t c = 0; c < D; ++c) Y[size_t(s * D + c)] = double(X[rows[s] * D + c]) - mean[c];
  // Solve Y L^T = Xc, i.e. y_i = L^-1 x_i, so ||y_i - y_j||^2 = d^T (S + lam I)^-1 d.
  constexpr int64_t kChunk = 64;  // rows per triangular solve; chunks run on the OpenMP threads
#pragma omp parallel for schedule(dynamic, 1) if(parallel_worth(double(nr) * double(D) * double(D)))
  for (int64_t r0 = 0; r0 < nr; r0 += kChunk)
    scipy_cblas_dtrsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, int(std::min(kChunk, nr - r0)),
                      int(D), 1.0, L.data(), int(D), Y.data() + r0 * D, int(D));

#pragma omp parallel for schedule(static) if(parallel_worth(double(n_pairs) * double(D)))
  for (int64_t p = 0; p < n_pairs; ++p) {
    const T* xi = X + pi[p] * D;
    const T* xj = X + pj[p] * D;
    const double* yi = Y.data() + slot[pi[p]] * D;
    const double* yj = Y.data() + slot[pj[p]] * D;
    double num = 0.0, den = 0.0;
    for (int64_t c = 0; c < D; ++c) {
      const double dx = double(xi[c]) - double(xj[c]);
      const double dy = yi[c] - yj[c];
      den += dx * dx;
      num += dy * dy;
    }
    out[p] = den > 0.0 ? num / den : std::numeric_limits<double>::quiet_NaN();
  }
}

template void pair_quotients<float>(const float*, int64_t, int64_t, const double*, const double*, double,
                                    const int64_t*, const int64_t*, int64_t, double*);
template void pair_quotients<double>(const double*, int64_t, int64_t, const double*, const double*, double,
                                     const int64_t*, const int64_t*, int64_t, double*);

}  // namespace dihal
