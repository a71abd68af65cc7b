// Local curvature kernel: for each row, the top eigenvalue of the covariance of its k-NN
// neighbourhood (the row and its k neighbours, centred at their mean, normalised by k + 1),
// computed from the (k+1) x (k+1) Gram matrix, never from a D x D matrix.
#include <cstddef>
#include <type_traits>
#include <vector>

#include "blas.hpp"
#include "kernels.hpp"
#include "nvtx.hpp"

namespace dihal {
using std::size_t;
namespace {

// c = x - xi rounded to W (the difference is exact in float64; for W = T it is the correctly
// rounded difference either way, so it is taken in T, which vectorises best).
template <typename T, typename W>
__attribute__((target_clones("avx512f", "avx2", "default")))
void shifted_row(const T* x, const T* xi, int64_t D, W* c) {
  if constexpr (std::is_same_v<T, W>) {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) c[j] = x[j] - xi[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) c[j] = W(double(x[j]) - double(xi[j]));
  }
}

// G (ldg columns) = C C^T for the kp x Dp row-major C (kp a multiple of 4, each row zero-padded to a
// multiple of 64 bytes): R x S blocks of the upper triangle (blocks on the diagonal whole), each an R S
// register accumulation over the columns in W, lanes summed in float64. OpenBLAS's small-matrix GEMM runs
// this 16 x 16 x D shape far below its GEMM rate (about 15 GFLOP/s at D = 4096 on one core). Inlined into
// the per-ISA entry points below, which pick the vector width and a block that fits the register file.
template <typename W, int VBytes, int R, int S>
__attribute__((always_inline)) inline void gram_upper_blocked(const W* C, int kp, int64_t Dp, double* G, int ldg) {
  typedef W V __attribute__((vector_size(VBytes)));
  // Loads through an element-aligned vector type: one unaligned load each (a memcpy into the array
  // compiles, for AVX2, to two 16-byte stores and a 32-byte reload: a store-forwarding stall per operand).
  typedef W VU __attribute__((vector_size(VBytes), aligned(sizeof(W))));
  constexpr int64_t L = VBytes / sizeof(W);
  for (int I = 0; I < kp; I += R)
    for (int J = I; J < kp; J += S) {
      V acc[R][S];
      for (int r = 0; r < R; ++r)
        for (int s = 0; s < S; ++s) acc[r][s] = V{};
      const W* A = C + int64_t(I) * Dp;
      const W* B = C + int64_t(J) * Dp;
      for (int64_t j = 0; j < Dp; j += L) {
        V a[R], b[S];
        for (int r = 0; r < R; ++r) a[r] = *reinterpret_cast<const VU*>(A + r * Dp + j);
        for (int s = 0; s < S; ++s) b[s] = *reinterpret_cast<const VU*>(B + s * Dp + j);
        for (int r = 0; r < R; ++r)
          for (int s = 0; s < S; ++s) acc[r][s] += a[r] * b[s];
      }
      for (int r = 0; r < R; ++r)
        for (int s = 0; s < S; ++s) {
          double sum = 0.0;
          for (int64_t l = 0; l < L; ++l) sum += double(acc[r][s][l]);
          G[(I + r) * ldg + J + s] = sum;
        }
    }
}

// AVX-512: 32 registers hold a 4 x 4 block (16 accumulators, 8 operands).
template <typename W>
__attribute__((target("avx512f"))) void gram_upper_avx512(const W* C, int kp, int64_t Dp, double* G, int ldg) {
  gram_upper_blocked<W, 64, 4, 4>(C, kp, Dp, G, ldg);
}

// AVX2 + FMA: 16 registers hold a 4 x 2 block (8 accumulators, 6 operands).
template <typename W>
__attribute__((target("avx2,fma"))) void gram_upper_avx2(const W* C, int kp, int64_t Dp, double* G, int ldg) {
  gram_upper_blocked<W, 32, 4, 2>(C, kp, Dp, G, ldg);
}

enum class GramIsa { avx512, avx2, blas };

GramIsa gram_isa() {
  static const GramIsa isa = __builtin_cpu_supports("avx512f")                                     ? GramIsa::avx512
                             : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? GramIsa::avx2
                                                                                                   : GramIsa::blas;
  return isa;
}

// The neighbourhood is shifted by its own point x_i (exact in float64, then rounded to W), so the
// Gram matrix G = C C^T (products in W) holds local-scale values; row 0 of C (x_i - x_i) is zero
// and left out, so G is k x k. Centring at the neighbourhood mean is then algebraic and in
// float64 on the (k+1) x (k+1) matrix: Gc = G - r 1^T - 1 r^T + s, r = row means, s = mean r.
template <typename T, typename W>
void local_top_eigenvalues_in(const T* X, int64_t n, int64_t D, const int64_t* idx, int64_t k, double* out) {
  const int m = int(k + 1);
  const GramIsa isa = gram_isa();
  const bool vector_gram = isa != GramIsa::blas;
  const int kp = vector_gram ? int((k + 3) / 4 * 4) : int(k);
  constexpr int64_t lanes = 64 / sizeof(W);
  const int64_t Dp = vector_gram ? (D + lanes - 1) / lanes * lanes : D;
#pragma omp parallel if(parallel_worth(double(n) * double(m) * double(m) * double(D)))
  {
    std::vector<W> C(size_t(kp) * size_t(Dp), W(0)), Gw(vector_gram ? 0 : size_t(k) * size_t(k));
    std::vector<double> G(size_t(kp) * size_t(kp)), Gc(size_t(m) * size_t(m)), r(static_cast<size_t>(m));
#pragma omp for schedule(dynamic, 8)
    for (int64_t i = 0; i < n; ++i) {
      const T* xi = X + i * D;
      for (int64_t a = 0; a < k; ++a) shifted_row(X + idx[i * k + a] * D, xi, D, C.data() + a * Dp);
      if (isa == GramIsa::avx512) {
        gram_upper_avx512(C.data(), kp, Dp, G.data(), kp);
      } else if (isa == GramIsa::avx2) {
        gram_upper_avx2(C.data(), kp, Dp, G.data(), kp);
      } else {
        blas::gemm_abt(int(k), int(k), int(D), C.data(), C.data(), Gw.data(), int(k));
        for (size_t e = 0; e < Gw.size(); ++e) G[e] = double(Gw[e]);
      }
      // G[a][b] for 1 <= a <= b <= k (upper triangle, in the kp-wide buffer); row and column 0 are zero.
      const auto g = [&](int a, int b) { return a == 0 || b == 0 ? 0.0 : a <= b ? G[size_t((a - 1) * kp + b - 1)] : G[size_t((b - 1) * kp + a - 1)]; };
      double s = 0.0;
      for (int a = 0; a < m; ++a) {
        double row = 0.0;
        for (int b = 0; b < m; ++b) row += g(a, b);
        r[size_t(a)] = row / m;
        s += row;
      }
      s /= double(m) * double(m);
      for (int a = 0; a < m; ++a)
        for (int b = 0; b < m; ++b) Gc[size_t(a * m + b)] = g(a, b) - r[size_t(a)] - r[size_t(b)] + s;
      out[i] = top_eigenvalue_small(Gc.data(), m) / double(m);
    }
  }
}

}  // namespace

template <typename T>
void local_top_eigenvalues(const T* X, int64_t n, int64_t D, const int64_t* idx, int64_t k, double* out,
                           bool float32_work) {
  DIHAL_NVTX_RANGE("dihal/local_eigen");
  if (float32_work)
    local_top_eigenvalues_in<T, float>(X, n, D, idx, k, out);
  else
    local_top_eigenvalues_in<T, double>(X, n, D, idx, k, out);
}

template void local_top_eigenvalues<float>(const float*, int64_t, int64_t, const int64_t*, int64_t, double*, bool);
template void local_top_eigenvalues<double>(const double*, int64_t, int64_t, const int64_t*, int64_t, double*, bool);

}  // namespace dihal
