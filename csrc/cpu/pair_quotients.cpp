// Monotonicity kernel: factor S + lam I = L L^T once (Cholesky, float64), whiten the rows that occur
// in pairs (Y = Xc L^-T, triangular solves in the working precision W), then each pair quotient is
// ||y_i - y_j||^2 / ||x_i - x_j||^2, both sums in float64.
#include <omp.h>

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
void whitened_quotients(const T* X, int64_t D, const double* mean, const std::vector<double>& L64, const int64_t* pi,
                        const int64_t* pj, int64_t n_pairs, const std::vector<int64_t>& rows,
                        const std::vector<int64_t>& slot, double* out) {
  const std::vector<W> L(L64.begin(), L64.end());
  const int64_t nr = int64_t(rows.size());
  std::vector<W> Y(size_t(nr) * size_t(D));
#pragma omp parallel for schedule(static) if(parallel_worth(double(nr) * double(D)))
  for (int64_t s = 0; s < nr; ++s)
    for (int64_t c = 0; c < D; ++c) Y[size_t(s * D + c)] = W(double(X[rows[s] * D + c]) - mean[c]);
  // Solve Y L^T = Xc, i.e. y_i = L^-1 x_i, so ||y_i - y_j||^2 = d^T (S + lam I)^-1 d. One large
  // solve per thread: OpenBLAS's TRSM is about 3x slower on 64-row panels than on whole blocks.
  const bool parallel = parallel_worth(double(nr) * double(D) * double(D));
  const int64_t parts = parallel ? std::min<int64_t>(omp_get_max_threads(), std::max<int64_t>(1, nr / 256)) : 1;
#pragma omp parallel for schedule(static, 1) num_threads(int(parts)) if(parts > 1)
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t r0 = nr * p / parts, r1 = nr * (p + 1) / parts;
    if (r1 > r0) blas::trsm_right_lower_trans(int(r1 - r0), int(D), L.data(), Y.data() + r0 * D);
  }
#pragma omp parallel for schedule(static) if(parallel_worth(double(n_pairs) * double(D)))
  for (int64_t p = 0; p < n_pairs; ++p) {
    const double den = sqdist_exact(X + pi[p] * D, X + pj[p] * D, D);
    const double num = sqdist_exact(Y.data() + slot[pi[p]] * D, Y.data() + slot[pj[p]] * D, D);
    out[p] = den > 0.0 ? num / den : std::numeric_limits<double>::quiet_NaN();
  }
}

}  // namespace

template <typename T>
void pair_quotients(const T* X, int64_t n, int64_t D, const double* mean, const double* S, double lam,
                    const int64_t* pi, const int64_t* pj, int64_t n_pairs, double* out, bool float32_work) {
  DIHAL_NVTX_RANGE("dihal/pairs");
  std::vector<double> L(size_t(D) * size_t(D));
  for (int64_t a = 0; a < D; ++a)
    for (int64_t b = 0; b < D; ++b) L[size_t(a * D + b)] = S[a * D + b] + (a == b ? lam : 0.0);
  const int info = parallel_cholesky(L.data(), D);
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
  if (float32_work)
    whitened_quotients<T, float>(X, D, mean, L, pi, pj, n_pairs, rows, slot, out);
  else
    whitened_quotients<T, double>(X, D, mean, L, pi, pj, n_pairs, rows, slot, out);
}

template void pair_quotients<float>(const float*, int64_t, int64_t, const double*, const double*, double,
                                    const int64_t*, const int64_t*, int64_t, double*, bool);
template void pair_quotients<double>(const double*, int64_t, int64_t, const double*, const double*, double,
                                     const int64_t*, const int64_t*, int64_t, double*, bool);

}  // namespace dihal
