// Blocked Cholesky factorisation on the OpenMP threads (around single-threaded OpenBLAS).
#include <algorithm>

#include "blas.hpp"
#include "kernels.hpp"

namespace dihal {

// Declared in kernels.hpp. The panel solves and the trailing updates are the bulk of the D^3/3 flops.
int parallel_cholesky(double* A, int64_t D) {
  constexpr int64_t B = 256;
  const bool parallel = parallel_worth(double(D) * double(D) * double(D) / 3.0);
  for (int64_t j0 = 0; j0 < D; j0 += B) {
    const int64_t nj = std::min(B, D - j0), below = D - j0 - nj;
    const int info = scipy_LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', int(nj), A + j0 * D + j0, int(D));
    if (info != 0) return int(j0) + info;
    if (below == 0) break;
    const int64_t nb = (below + B - 1) / B;
    double* Ljj = A + j0 * D + j0;
#pragma omp parallel for schedule(dynamic, 1) if(parallel)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t i0 = j0 + nj + b * B, ni = std::min(B, D - i0);
      scipy_cblas_dtrsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, int(ni), int(nj), 1.0, Ljj,
                        int(D), A + i0 * D + j0, int(D));
    }
#pragma omp parallel for schedule(dynamic, 1) if(parallel)
    for (int64_t t = 0; t < nb * (nb + 1) / 2; ++t) {
      int64_t bi = 0, rest = t;  // t-th tile (bi, bl), bl <= bi, row by row
      while (rest > bi) rest -= ++bi;
      const int64_t bl = rest;
      const int64_t i0 = j0 + nj + bi * B, l0 = j0 + nj + bl * B;
      const int64_t ni = std::min(B, D - i0), nl = std::min(B, D - l0);
      scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(ni), int(nl), int(nj), -1.0, A + i0 * D + j0,
                        int(D), A + l0 * D + j0, int(D), 1.0, A + i0 * D + l0, int(D));
    }
  }
  return 0;
}

}  // namespace dihal
