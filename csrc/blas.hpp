// BLAS/LAPACK from the scipy-openblas32 wheel (symbols carry the scipy_ prefix), with small
// overloads so that the templated kernels call the right precision.
//
// Threading: the module sets OpenBLAS to one thread when it loads, and every kernel parallelises
// with OpenMP around single-threaded BLAS calls. Two thread pools (OpenBLAS's spinning workers and
// OpenMP's) never compete for the cores, which matters on small or shared machines.
#pragma once
#include <cblas.h>
#include <lapacke.h>

#include <omp.h>

#include <algorithm>
#include <cstddef>

namespace dihal::blas {

inline void use_single_threaded_blas() { scipy_openblas_set_num_threads(1); }

inline void gemm_atb(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
  scipy_cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}
inline void gemm_atb(int m, int n, int k, const double* A, int lda, const double* B, int ldb, double* C, int ldc) {
  scipy_cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0, A, lda, B, ldb, 0.0, C, ldc);
}

inline void syrk_upper(bool trans, int n, int k, const float* A, int lda, float* C, int ldc) {
  scipy_cblas_ssyrk(CblasRowMajor, CblasUpper, trans ? CblasTrans : CblasNoTrans, n, k, 1.0f, A, lda, 0.0f, C, ldc);
}
inline void syrk_upper(bool trans, int n, int k, const double* A, int lda, double* C, int ldc) {
  scipy_cblas_dsyrk(CblasRowMajor, CblasUpper, trans ? CblasTrans : CblasNoTrans, n, k, 1.0, A, lda, 0.0, C, ldc);
}

// C (m x n) = A (m x k) * B (n x k)^T, all row-major with leading dimension lda/ldb = k.
inline void gemm_abt(int m, int n, int k, const float* A, const float* B, float* C, int ldc) {
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, A, k, B, k, 0.0f, C, ldc);
}
inline void gemm_abt(int m, int n, int k, const double* A, const double* B, double* C, int ldc) {
  scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0, A, k, B, k, 0.0, C, ldc);
}

// Upper triangle (row-major, leading dimension ldc) of the n x n Gram matrix C = A^T A of the
// columns of A (trans: A is k x n row-major) or C = A A^T of its rows (A is n x k). Few large
// calls: 2 x threads blocks a side (one SYRK when serial), SYRKs on the diagonal blocks and GEMMs
// off it, on the OpenMP threads, so that OpenBLAS packs each panel a few times instead of once per
// small tile and no flops go to the lower triangle.
template <typename T>
void gram_upper(bool trans, int n, int k, const T* A, T* C, int ldc) {
  const bool parallel = double(n) * double(n) * double(k) > double(1 << 18) && omp_get_max_threads() > 1 && n >= 128;
  const int parts = parallel ? 2 * omp_get_max_threads() : 1;
  const int B = (n + parts - 1) / parts, nb = (n + B - 1) / B;
  const int offdiag = nb * (nb - 1) / 2;
#pragma omp parallel for schedule(dynamic, 1) if(parallel)
  for (int t = 0; t < offdiag + nb; ++t) {
    int I = t - offdiag, J = I;  // the diagonal blocks (SYRK, half the work) come last
    if (t < offdiag) {
      int rest = t;  // t-th block (I, J), J > I, row by row
      I = 0;
      while (rest >= nb - 1 - I) rest -= nb - 1 - I++;
      J = I + 1 + rest;
    }
    const int i0 = I * B, j0 = J * B;
    const int rows = std::min(B, n - i0), cols = std::min(B, n - j0);
    T* out = C + size_t(i0) * size_t(ldc) + size_t(j0);
    if (I == J)
      syrk_upper(trans, rows, k, trans ? A + i0 : A + size_t(i0) * size_t(k), trans ? n : k, out, ldc);
    else if (trans)
      gemm_atb(rows, cols, k, A + i0, n, A + j0, n, out, ldc);
    else
      gemm_abt(rows, cols, k, A + size_t(i0) * size_t(k), A + size_t(j0) * size_t(k), out, ldc);
  }
}

// Upper triangle of C = A^T A for A (n x D, row-major): the D x D co-moment of its rows.
template <typename T>
void gram_upper_t(int D, int n, const T* A, T* C) {
  gram_upper(true, D, n, A, C, D);
}


// B (m x n, row-major) <- B L^-T for a lower-triangular L (n x n, row-major): rows of B whitened.
inline void trsm_right_lower_trans(int m, int n, const float* L, float* B) {
  scipy_cblas_strsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, m, n, 1.0f, L, n, B, n);
}
inline void trsm_right_lower_trans(int m, int n, const double* L, double* B) {
  scipy_cblas_dtrsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, m, n, 1.0, L, n, B, n);
}

}  // namespace dihal::blas
