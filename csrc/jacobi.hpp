// Top eigenpair of a small symmetric matrix by cyclic Jacobi rotations, callable from host and
// device code: the CPU Lanczos uses it on its tridiagonal matrices (with the eigenvector), the GPU
// local-curvature kernel on a neighbourhood Gram matrix held in shared memory (value only).
#pragma once
#include <cmath>

#include "host_device.hpp"

namespace dihal {

// A is m x m row-major and symmetric; it is overwritten. When V (an m x m workspace) and vec are
// given, the unit eigenvector of the returned (largest) eigenvalue is written to vec.
DIHAL_HOST_DEVICE double jacobi_top_eigenpair(double* A, int m, double* V, double* vec) {
  if (V)
    for (int p = 0; p < m; ++p)
      for (int q = 0; q < m; ++q) V[p * m + q] = p == q ? 1.0 : 0.0;
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
        if (V)
          for (int r = 0; r < m; ++r) {  // V <- V J
            const double vrp = V[r * m + p], vrq = V[r * m + q];
            V[r * m + p] = c * vrp - s * vrq;
            V[r * m + q] = s * vrp + c * vrq;
          }
      }
    }
  }
  int best = 0;
  for (int p = 1; p < m; ++p)
    if (A[p * m + p] > A[best * m + best]) best = p;
  if (V && vec)
    for (int r = 0; r < m; ++r) vec[r] = V[r * m + best];
  return A[best * m + best];
}

DIHAL_HOST_DEVICE double jacobi_top_eigenvalue(double* A, int m) { return jacobi_top_eigenpair(A, m, nullptr, nullptr); }

}  // namespace dihal
