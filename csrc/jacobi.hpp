// Top eigenpair of a small symmetric matrix by Jacobi rotations, callable from host and device
// code: the CPU Lanczos uses the cyclic version on its tridiagonal matrices (with the eigenvector),
// the GPU local-curvature kernel the parallel (round-robin) version on a neighbourhood Gram matrix
// held in shared memory, with every thread of the block (jacobi_top_eigenvalue_team).
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

// The largest eigenvalue of the symmetric m x m row-major A (overwritten) by parallel Jacobi: each
// sweep is M - 1 rounds (M = m rounded up to even) of the round-robin tournament, a round rotates
// M / 2 disjoint (p, q) pairs at once (angles from A as the round starts, then all column updates,
// then all row updates: the product of disjoint rotations, J^T A J). Team runs the parallel parts:
// for_each(count, f) calls f(0 .. count - 1) across its threads and then synchronises; single(f)
// calls f on one thread and synchronises. cs (2 * (M / 2) doubles) and stop (one int) are shared.
#ifdef __CUDACC__
#pragma nv_exec_check_disable  // instantiated on the device with BlockTeam, on the host with SerialTeam
#endif
template <typename Team>
DIHAL_HOST_DEVICE double jacobi_top_eigenvalue_team(double* A, int m, double* cs, int* stop, const Team& team) {
  const int M = m + (m & 1), half = M / 2;
  // Pair i of round r: (r, M - 1) for i = 0, else ((r + i) mod (M - 1), (r - i) mod (M - 1)).
  const auto pair = [M](int r, int i, int& p, int& q) {
    const int a = i == 0 ? r : (r + i) % (M - 1), b = i == 0 ? M - 1 : (r - i + (M - 1)) % (M - 1);
    p = a < b ? a : b;
    q = a < b ? b : a;
  };
  for (int sweep = 0; sweep < 100 && m > 1; ++sweep) {
    team.single([&] {
      double off = 0.0, diag = 0.0;
      for (int p = 0; p < m; ++p) {
        diag += A[p * m + p] * A[p * m + p];
        for (int q = p + 1; q < m; ++q) off += A[p * m + q] * A[p * m + q];
      }
      *stop = off <= 1e-30 * diag || off == 0.0;
    });
    if (*stop) break;
    for (int r = 0; r < M - 1; ++r) {
      team.for_each(half, [&](int i) {
        int p, q;
        pair(r, i, p, q);
        double c = 1.0, s = 0.0;
        if (q < m && A[p * m + q] != 0.0) {
          const double apq = A[p * m + q];
          const double theta = (A[q * m + q] - A[p * m + p]) / (2.0 * apq);
          const double t = copysign(1.0, theta) / (fabs(theta) + sqrt(theta * theta + 1.0));
          c = 1.0 / sqrt(t * t + 1.0);
          s = t * c;
        }
        cs[2 * i] = c;
        cs[2 * i + 1] = s;
      });
      // A <- A J (columns p, q of every row: outer m, inner 1), then A <- J^T A (rows p, q: outer 1, inner m).
      const auto rotate = [&](int outer, int inner) {
        team.for_each(half * m, [&](int e) {
          const int i = e / m, t = e % m;
          int p, q;
          pair(r, i, p, q);
          if (q >= m) return;
          double& x = A[t * outer + p * inner];
          double& y = A[t * outer + q * inner];
          const double c = cs[2 * i], s = cs[2 * i + 1], xp = x, yq = y;
          x = c * xp - s * yq;
          y = s * xp + c * yq;
        });
      };
      rotate(m, 1);
      rotate(1, m);
    }
  }
  double best = A[0];
  for (int p = 1; p < m; ++p) best = A[p * m + p] > best ? A[p * m + p] : best;
  return best;
}

// The Team of jacobi_top_eigenvalue_team on the host: one thread, phases run in order.
struct SerialTeam {
  template <typename F>
  void for_each(int count, F&& f) const {
    for (int i = 0; i < count; ++i) f(i);
  }
  template <typename F>
  void single(F&& f) const {
    f();
  }
};

}  // namespace dihal
