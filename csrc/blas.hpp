// BLAS/LAPACK from the scipy-openblas32 wheel (symbols carry the scipy_ prefix), with small
// overloads so that the templated kernels call the right precision.
#pragma once
#include <cblas.h>
#include <lapacke.h>

#include <cstddef>

namespace dihal::blas {

inline void syrk_upper_t(int D, int n, const float* A, float* C) {
  scipy_cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, D, n, 1.0f, A, D, 0.0f, C, D);
}
inline void syrk_upper_t(int D, int n, const double* A, double* C) {
  scipy_cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, D, n, 1.0, A, D, 0.0, C, D);
}
inline void gemm_atb(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
  scipy_cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}
inline void gemm_atb(int m, int n, int k, const double* A, int lda, const double* B, int ldb, double* C, int ldc) {
  scipy_cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0, A, lda, B, ldb, 0.0, C, ldc);
}

// Upper triangle of C = A^T A for A (n x D, row-major), as row panels of GEMMs: OpenBLAS's GEMM
// runs well above its SYRK, and the panels add only about panel/D extra flops.
template <typename T>
void gram_upper_t(int D, int n, const T* A, T* C) {
  constexpr int kPanel = 256;
  if (D <= kPanel) {
    syrk_upper_t(D, n, A, C);
    return;
  }
  for (int i0 = 0; i0 < D; i0 += kPanel) {
    const int rows = D - i0 < kPanel ? D - i0 : kPanel;
    gemm_atb(rows, D - i0, n, A + i0, D, A + i0, D, C + size_t(i0) * size_t(D) + size_t(i0), D);
  }
}

// C (m x n) = A (m x k) * B (n x k)^T, all row-major with leading dimension lda/ldb = k.
inline void gemm_abt(int m, int n, int k, const float* A, const float* B, float* C, int ldc) {
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, A, k, B, k, 0.0f, C, ldc);
}
inline void gemm_abt(int m, int n, int k, const double* A, const double* B, double* C, int ldc) {
  scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0, A, k, B, k, 0.0, C, ldc);
}

// Runs the enclosed scope with OpenBLAS on one thread (for BLAS calls inside OpenMP regions).
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : previous_(scipy_openblas_get_num_threads()) { scipy_openblas_set_num_threads(1); }
  ~SingleThreadedBlas() { scipy_openblas_set_num_threads(previous_); }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int previous_;
};

}  // namespace dihal::blas
