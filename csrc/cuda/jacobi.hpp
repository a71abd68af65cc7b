// Largest eigenvalue of a small symmetric matrix by cyclic Jacobi rotations: the CPU routine of
// csrc/cpu/eigen.cpp (same rotations and stopping rule), callable from device code, where one
// thread runs it on a neighbourhood Gram matrix held in shared memory.
#pragma once
#include <cmath>

#ifdef __CUDACC__
#define DIHAL_JACOBI_HD __host__ __device__ inline
#else
#define DIHAL_JACOBI_HD inline
#endif

namespace dihal::cuda {

// A is m x m row-major and symmetric; it is overwritten.
DIHAL_JACOBI_HD double jacobi_top_eigenvalue(double* A, int m) {
  for (int sweep = 0; sweep < 100 && m > 1; ++sweep) {
    double off = 0.0, diag = 0.0;
    for (int p = 0; p < m; ++p) {
      diag += A[p * m + p] * A[p * m + p];
      for (int q = p + 1; q < m; ++q) off += A[p * m + q] * A[p * m + q];
    }
    if (off <= 1e-30 * diag || off == 0.0) break;
    for (int p = 0; p < m - 1; ++p) {
      for (int q = p + 1; q < m; ++q) {
        const double apq = A[p * m + q];
        if (apq == 0.0) continue;
        const double theta = (A[q * m + q] - A[p * m + p]) / (2.0 * apq);
        const double t = copysign(1.0, theta) / (fabs(theta) + sqrt(theta * theta + 1.0));
        const double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
        for (int r = 0; r < m; ++r) {  // A <- A J (columns p, q)
          const double arp = A[r * m + p], arq = A[r * m + q];
          A[r * m + p] = c * arp - s * arq;
          A[r * m + q] = s * arp + c * arq;
        }
        for (int r = 0; r < m; ++r) {  // A <- J^T A (rows p, q)
          const double apr = A[p * m + r], aqr = A[q * m + r];
          A[p * m + r] = c * apr - s * aqr;
          A[q * m + r] = s * apr + c * aqr;
        }
      }
    }
  }
  double best = A[0];
  for (int p = 1; p < m; ++p) best = A[p * m + p] > best ? A[p * m + p] : best;
  return best;
}

}  // namespace dihal::cuda
