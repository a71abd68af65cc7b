// BLAS/LAPACK from the scipy-openblas32 wheel (symbols carry the scipy_ prefix), with small
// overloads so that the templated kernels call the right precision.
//
// Threading: the module sets OpenBLAS to one thread when it loads, and every kernel parallelises
// with OpenMP around single-threaded BLAS calls. Two thread pools (OpenBLAS's spinning workers and
// OpenMP's) never compete for the cores, which matters on small or shared machines.
#pragma once
#include <cblas.h>
#include <lapacke.h>

#include <cstddef>

namespace dihal::blas {

inline void use_single_threaded_blas() { scipy_openblas_set_num_threads(1); }

inline void gemm_atb(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
  scipy_cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}
inline void gemm_atb(int m, int n, int k, const double* A, int lda, const double* B, int ldb, double* C, int ldc) {
  scipy_cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0, A, lda, B, ldb, 0.0, C, ldc);
}

// Upper triangle of C = A^T A for A (n x D, row-major) as GEMMs on square tiles of the upper
// triangle, spread over the OpenMP threads (OpenBLAS's GEMM runs well above its SYRK; diagonal
// tiles add about tile/D extra flops).
template <typename T>
void gram_upper_t(int D, int n, const T* A, T* C) {
  constexpr int kTile = 256;
  const int nt = (D + kTile - 1) / kTile;
  const int ntiles = nt * (nt + 1) / 2;
#pragma omp parallel for schedule(dynamic, 1) if(ntiles > 1 && double(n) * double(D) * double(D) > double(1 << 18))
  for (int t = 0; t < ntiles; ++t) {
    int I = 0, rest = t;  // t-th tile (I, J), J >= I, row by row
    while (rest >= nt - I) rest -= nt - I++;
    const int J = I + rest;
    const int i0 = I * kTile, j0 = J * kTile;
    const int rows = D - i0 < kTile ? D - i0 : kTile, cols = D - j0 < kTile ? D - j0 : kTile;
    gemm_atb(rows, cols, n, A + i0, D, A + j0, D, C + size_t(i0) * size_t(D) + size_t(j0), D);
  }
}

// C (m x n) = A (m x k) * B (n x k)^T, all row-major with leading dimension lda/ldb = k.
inline void gemm_abt(int m, int n, int k, const float* A, const float* B, float* C, int ldc) {
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, A, k, B, k, 0.0f, C, ldc);
}
inline void gemm_abt(int m, int n, int k, const double* A, const double* B, double* C, int ldc) {
  scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0, A, k, B, k, 0.0, C, ldc);
}

// B (m x n, row-major) <- B L^-T for a lower-triangular L (n x n, row-major): rows of B whitened.
inline void trsm_right_lower_trans(int m, int n, const float* L, float* B) {
  scipy_cblas_strsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, m, n, 1.0f, L, n, B, n);
}
inline void trsm_right_lower_trans(int m, int n, const double* L, double* B) {
  scipy_cblas_dtrsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, m, n, 1.0, L, n, B, n);
}

}  // namespace dihal::blas
