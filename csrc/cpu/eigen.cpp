// Top eigenvalues: Householder + Sturm bisection for small dense symmetric matrices, Lanczos with
// full reorthogonalisation (Ritz pairs by Jacobi, csrc/jacobi.hpp) for large positive semi-definite ones.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "blas.hpp"
#include "jacobi.hpp"
#include "kernels.hpp"
#include "nvtx.hpp"

namespace dihal {

// Householder reduction of a symmetric m x m matrix to tridiagonal form (diagonal d, off-diagonal e),
// then top_eigenvalue_tridiagonal: about 4/3 m^3 + 50 m flops.
double top_eigenvalue_small(double* A, int m) {
  if (m == 1) return A[0];
  std::vector<double> v(static_cast<size_t>(m)), p(static_cast<size_t>(m)), d(static_cast<size_t>(m)),
      e(static_cast<size_t>(m), 0.0);
  for (int k = 0; k + 2 < m; ++k) {
    double alpha = 0.0;
    for (int i = k + 1; i < m; ++i) alpha += A[i * m + k] * A[i * m + k];
    alpha = std::sqrt(alpha);
    if (alpha == 0.0) continue;
    if (A[(k + 1) * m + k] > 0) alpha = -alpha;
    // v = x - alpha e_1 (on rows k+1..m-1), H = I - 2 v v^T / (v^T v)
    double vnorm2 = 0.0;
    for (int i = k + 1; i < m; ++i) {
      v[size_t(i)] = A[i * m + k] - (i == k + 1 ? alpha : 0.0);
      vnorm2 += v[size_t(i)] * v[size_t(i)];
    }
    if (vnorm2 == 0.0) continue;
    const double beta = 2.0 / vnorm2;
    // A <- H A H on the trailing block: p = beta A v, w = p - (beta/2)(p.v) v, A -= v w^T + w v^T
    double pv = 0.0;
    for (int i = k + 1; i < m; ++i) {
      double s = 0.0;
      for (int j = k + 1; j < m; ++j) s += A[i * m + j] * v[size_t(j)];
      p[size_t(i)] = beta * s;
      pv += p[size_t(i)] * v[size_t(i)];
    }
    const double c = 0.5 * beta * pv;
    for (int i = k + 1; i < m; ++i) p[size_t(i)] -= c * v[size_t(i)];
    for (int i = k + 1; i < m; ++i)
      for (int j = k + 1; j < m; ++j) A[i * m + j] -= v[size_t(i)] * p[size_t(j)] + p[size_t(i)] * v[size_t(j)];
    A[(k + 1) * m + k] = A[k * m + k + 1] = alpha;
    for (int i = k + 2; i < m; ++i) A[i * m + k] = A[k * m + i] = 0.0;
  }
  for (int i = 0; i < m; ++i) d[size_t(i)] = A[i * m + i];
  for (int i = 0; i + 1 < m; ++i) e[size_t(i)] = A[(i + 1) * m + i];
  return top_eigenvalue_tridiagonal(d.data(), e.data(), m);
}

// Largest eigenvalue of the symmetric tridiagonal matrix T (diagonal d[m], off-diagonal e[m-1]).
// Laguerre's iteration on p(x) = det(x I - T) from the Gershgorin upper bound: p has only real
// roots, so from above the largest one the iterates decrease monotonically to it, cubically near
// a simple root (about 4 steps where bisection takes 50 halvings). p'/p and (p'/p)' come from the
// pivots u_i of x I - T (the LDL^T pivots of the Sturm count): all are positive exactly when x is
// above every eigenvalue. An iterate that rounding puts at or below the root becomes the lower end
// of the bracket, and bisection on the Sturm count finishes what Laguerre does not (a multiple or
// tightly clustered top eigenvalue, where it converges only linearly).
double top_eigenvalue_tridiagonal(const double* d_in, const double* e_in, int m) {
  // Work on T scaled by a power of two to max |entry| ~ 1 (exact), so that e^2 neither under- nor
  // overflows.
  double big = 0.0;
  for (int i = 0; i < m; ++i) big = std::max({big, std::fabs(d_in[i]), i + 1 < m ? std::fabs(e_in[i]) : 0.0});
  if (big == 0.0) return 0.0;
  const int shift = std::ilogb(big);
  std::vector<double> d(static_cast<size_t>(m)), e(static_cast<size_t>(m), 0.0);
  for (int i = 0; i < m; ++i) {
    d[size_t(i)] = std::ldexp(d_in[i], -shift);
    if (i + 1 < m) e[size_t(i)] = std::ldexp(e_in[i], -shift);
  }
  double lo = d[0], hi = d[0];
  for (int i = 0; i < m; ++i) {
    const double r = (i + 1 < m ? std::fabs(e[size_t(i)]) : 0.0) + (i > 0 ? std::fabs(e[size_t(i - 1)]) : 0.0);
    lo = std::min(lo, d[size_t(i)] - r);
    hi = std::max(hi, d[size_t(i)] + r);
  }
  const double scale = std::max(std::fabs(lo), std::fabs(hi));
  const double tol = 2.0 * std::numeric_limits<double>::epsilon() * scale;
  const double tiny = std::numeric_limits<double>::min() / std::numeric_limits<double>::epsilon();
  // Whether x is above every eigenvalue; if so, the Laguerre step from x.
  const auto above = [&](double x, double* step) {
    double u = 1.0, a = 0.0, b = 0.0, G = 0.0, H = 0.0;  // u_{i-1}, u'/u and u''/u of the previous pivot
    for (int i = 0; i < m; ++i) {
      const double t = i > 0 ? e[i - 1] * e[i - 1] / u : 0.0;
      u = x - d[i] - t;
      if (!(u > tiny)) return false;
      const double an = (1.0 + t * a) / u, bn = t * (b - 2.0 * a * a) / u;
      a = an;
      b = bn;
      G += an;
      H += an * an - bn;
    }
    *step = double(m) / (G + std::sqrt(std::max(0.0, double(m - 1) * (double(m) * H - G * G))));
    return true;
  };
  double x = hi;
  for (int it = 0; it < 30 && hi - lo > tol; ++it) {
    double step = 0.0;
    if (!above(x, &step)) {
      lo = x;
      break;
    }
    hi = x;
    if (!(step > 0.25 * tol)) return std::ldexp(std::max(x - step, lo), shift);  // converged: root in [x - step, x]
    x = std::max(x - step, lo);
  }
  const auto count_below = [&](double y) {  // eigenvalues < y (Sturm sequence of the LDL^T pivots)
    int count = 0;
    double q = 1.0;
    for (int i = 0; i < m; ++i) {
      const double off = i > 0 ? e[i - 1] * e[i - 1] : 0.0;
      q = d[i] - y - (i > 0 ? off / q : 0.0);
      if (std::fabs(q) < tiny) q = -tiny;
      if (q < 0) ++count;
    }
    return count;
  };
  for (int it = 0; it < 200 && hi - lo > tol; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (mid <= lo || mid >= hi) break;
    if (count_below(mid) == m) hi = mid;  // every eigenvalue is below mid
    else lo = mid;
  }
  return std::ldexp(0.5 * (lo + hi), shift);
}

double top_eigenvalue_psd(const double* S, int64_t D, double rel_tol, int* iterations, bool float32_work) {
  DIHAL_NVTX_RANGE("dihal/top_eigen");
  if (D == 1) {
    if (iterations) *iterations = 0;
    return S[0];
  }
  const int64_t max_iter = std::min<int64_t>(D, 300);
  std::vector<double> V(size_t(max_iter + 1) * size_t(D));  // Lanczos basis, one row per vector
  std::vector<double> alpha, beta, w(D), T;
  // Deterministic, well-spread start vector.
  uint64_t state = 0x9E3779B97F4A7C15ull;
  double norm = 0.0;
  for (int64_t i = 0; i < D; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    V[size_t(i)] = 0.5 + double(state >> 11) * (1.0 / 9007199254740992.0);
    norm += V[size_t(i)] * V[size_t(i)];
  }
  norm = std::sqrt(norm);
  for (int64_t i = 0; i < D; ++i) V[size_t(i)] /= norm;

  // w = S v over row blocks on the OpenMP threads (S is stored full); with float32_work the
  // products read a float32 copy of S (half the memory traffic) and are summed in float32.
  // One product is a fork and a join per iteration: below D = 2048 (S32 under 16 MB, a fraction of a
  // millisecond per product) it runs on the calling thread, since on a loaded machine each join waits for
  // a descheduled partner (measured at D = 1,024, 2 threads, load 2.3: 167 ms forked, 6 ms idle).
  const bool parallel_products = D >= 2048 && parallel_worth(double(D) * double(D));
  const std::vector<float> S32 = float32_work ? std::vector<float>(S, S + size_t(D) * size_t(D)) : std::vector<float>();
  std::vector<float> v32(float32_work ? size_t(D) : 0), w32(v32.size());
  const auto matvec = [&](const double* v) {
    if (float32_work) std::copy(v, v + D, v32.begin());
#pragma omp parallel for schedule(static) if(parallel_products)
    for (int64_t r0 = 0; r0 < D; r0 += 256) {
      const int rows = int(std::min<int64_t>(256, D - r0));
      if (float32_work) {
        scipy_cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, int(D), 1.0f, S32.data() + r0 * D, int(D), v32.data(), 1,
                          0.0f, w32.data() + r0, 1);
        std::copy(w32.begin() + r0, w32.begin() + r0 + rows, w.begin() + r0);
      } else {
        scipy_cblas_dgemv(CblasRowMajor, CblasNoTrans, rows, int(D), 1.0, S + r0 * D, int(D), v, 1, 0.0, w.data() + r0, 1);
      }
    }
  };

  double theta = 0.0;
  int64_t j = 0;
  for (; j < max_iter; ++j) {
    double* v = V.data() + j * D;
    matvec(v);
    const double a = scipy_cblas_ddot(int(D), w.data(), 1, v, 1);
    alpha.push_back(a);
    // Full reorthogonalisation (twice is enough) against all previous vectors.
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t i = 0; i <= j; ++i) {
        const double* vi = V.data() + i * D;
        const double h = scipy_cblas_ddot(int(D), w.data(), 1, vi, 1);
        scipy_cblas_daxpy(int(D), -h, vi, 1, w.data(), 1);
      }
    const double b = scipy_cblas_dnrm2(int(D), w.data(), 1);

    // Ritz values of the tridiagonal T_j; residual of the top Ritz pair is |b * s_last|.
    const int m = int(j + 1);
    T.assign(size_t(m) * size_t(m), 0.0);
    for (int i = 0; i < m; ++i) {
      T[size_t(i * m + i)] = alpha[size_t(i)];
      if (i + 1 < m) T[size_t(i * m + i + 1)] = T[size_t((i + 1) * m + i)] = beta[size_t(i)];
    }
    std::vector<double> s(static_cast<size_t>(m)), work(static_cast<size_t>(m) * static_cast<size_t>(m));
    theta = jacobi_top_eigenpair(T.data(), m, work.data(), s.data());
    const double last = s[size_t(m - 1)];
    const double residual = std::fabs(b * last);
    if (b <= 1e-14 * std::max(std::fabs(theta), 1e-300) || (residual <= rel_tol * std::fabs(theta))) {
      ++j;
      break;
    }
    beta.push_back(b);
    double* vnext = V.data() + (j + 1) * D;
    for (int64_t i = 0; i < D; ++i) vnext[i] = w[size_t(i)] / b;
  }
  if (iterations) *iterations = int(j);
  if (j >= max_iter && max_iter < D) {
    // Not converged within the iteration cap: fall back to LAPACK's symmetric solver (top eigenvalue only).
    std::vector<double> A(S, S + size_t(D) * size_t(D));
    int found = 0;
    double value = 0.0, z = 0.0;
    std::vector<int> support(2);
    const int info = scipy_LAPACKE_dsyevr(LAPACK_ROW_MAJOR, 'N', 'I', 'U', int(D), A.data(), int(D), 0.0, 0.0, int(D),
                                          int(D), 0.0, &found, &value, &z, 1, support.data());
    if (info != 0 || found != 1) throw std::runtime_error("LAPACK dsyevr failed on the covariance matrix");
    return value;
  }
  return theta;
}

}  // namespace dihal
