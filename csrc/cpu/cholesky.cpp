// Blocked Cholesky factorisation on the OpenMP threads (around single-threaded OpenBLAS).
#include <algorithm>

#include "blas.hpp"
#include "kernels.hpp"

namespace dihal {

// Declared in kernels.hpp. The panel solves and the trailing updates are the bulk of the D^3/3 flops.
// The same right-looking algorithm serves both layouts: at(r, c) is element (r, c) of A in the
// chosen layout, and every BLAS/LAPACK call is told that layout.
int parallel_cholesky(double* A, int64_t D, bool column_major) {
  constexpr int64_t B = 256;
  const bool parallel = parallel_worth(double(D) * double(D) * double(D) / 3.0);
  const auto at = [&](int64_t r, int64_t c) { return column_major ? A + c * D + r : A + r * D + c; };
  const int lapack_layout = column_major ? LAPACK_COL_MAJOR : LAPACK_ROW_MAJOR;
  const CBLAS_ORDER order = column_major ? CblasColMajor : CblasRowMajor;
  for (int64_t j0 = 0; j0 < D; j0 += B) {
    const int64_t nj = std::min(B, D - j0), below = D - j0 - nj;
    const int info = scipy_LAPACKE_dpotrf(lapack_layout, 'L', int(nj), at(j0, j0), int(D));
    if (info != 0) return int(j0) + info;
    if (below == 0) break;
    const int64_t nb = (below + B - 1) / B;
    const double* Ljj = at(j0, j0);
#pragma omp parallel for schedule(dynamic, 1) if(parallel)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t i0 = j0 + nj + b * B, ni = std::min(B, D - i0);
      scipy_cblas_dtrsm(order, CblasRight, CblasLower, CblasTrans, CblasNonUnit, int(ni), int(nj), 1.0, Ljj, int(D),
                        at(i0, j0), int(D));
    }
#pragma omp parallel for schedule(dynamic, 1) if(parallel)
    for (int64_t t = 0; t < nb * (nb + 1) / 2; ++t) {
      int64_t bi = 0, rest = t;  // t-th tile (bi, bl), bl <= bi, row by row
      while (rest > bi) rest -= ++bi;
      const int64_t bl = rest;
      const int64_t i0 = j0 + nj + bi * B, l0 = j0 + nj + bl * B;
      const int64_t ni = std::min(B, D - i0), nl = std::min(B, D - l0);
      scipy_cblas_dgemm(order, CblasNoTrans, CblasTrans, int(ni), int(nl), int(nj), -1.0, at(i0, j0), int(D), at(l0, j0),
                        int(D), 1.0, at(i0, l0), int(D));
    }
  }
  return 0;
}

}  // namespace dihal
