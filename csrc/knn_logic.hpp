// The exact kNN logic shared by the CPU kernel (cpu/knn.cpp), the CUDA kernels (cuda/knn.cu) and
// the host emulation of the CUDA pipeline (cpu/knn_emulation.cpp), so that all three compute the
// same function with the same proven certificate (the ErrorModel of each path, certify_limit).
//
// Pipeline (the host preparation is centre_and_scale of cpu/knn.cpp, the device one in cuda/knn.cu): rows are
// centred and scaled by a power of two so that |value| <= 1, rounded to the
// working type W (float, or double for float64 input); tiles of dot products come from a GEMM
// (OpenBLAS or cuBLAS); each query keeps a sorted list of its `cap` smallest approximate distances
// (on the GPU one list per split of the reference columns, merged afterwards); the candidates are
// re-ranked with exact float64 distances on the original rows, and the answer is certified when
// every rejected point's approximate distance exceeds the limit of certify_limit (the k-th exact
// distance plus a proven rounding bound). Uncertified rows are recomputed exactly against all rows.
#pragma once
#include <cmath>
#include <cstdint>

#include "host_device.hpp"

#include <algorithm>

namespace dihal::knn_logic {

// Candidates kept per row.
DIHAL_HOST_DEVICE int64_t capacity(int64_t n, int64_t k) {
  const int64_t extra = k / 2 > 16 ? k / 2 : 16;
  return k + extra < n - 1 ? k + extra : n - 1;
}

// Tiling of the CUDA kernel (cuda/knn.cu), shared with its host emulation: queries per block of
// work (rows of a tile), reference rows per tile, (query, split) threads wanted per tile scan, the
// most splits, and the byte budget of the split lists.
struct Tiling {
  int64_t query_block, ref_block, target_threads, max_splits, list_bytes;
};
constexpr Tiling kTiling{4096, 4096, 65536, 32, int64_t(128) << 20};

struct Plan {
  int64_t query_block, ref_block, splits, cap;
};

// The CUDA kernel's plan for n rows and k neighbours (list entries of list_entry_bytes).
inline Plan make_plan(int64_t n, int64_t k, int64_t list_entry_bytes, const Tiling& t) {
  Plan p;
  p.cap = capacity(n, k);
  p.query_block = std::min(n, t.query_block);
  p.ref_block = std::min(n, t.ref_block);
  const int64_t per_split = p.query_block * p.cap * list_entry_bytes;
  // Enough (query, split) threads to fill the GPU, but at least 4 cap columns per split and tile:
  // filling a list costs O(cap^2), so short splits would spend their time filling lists.
  p.splits = std::min({(t.target_threads + p.query_block - 1) / p.query_block, t.max_splits, p.ref_block / (4 * p.cap),
                       t.list_bytes / per_split});
  p.splits = std::max<int64_t>(1, p.splits);
  return p;
}

// 2^-(e+1) for the largest |x - mean| = f 2^e (f in [1, 2)): every scaled value is below 1, and
// the scaling is exact.
DIHAL_HOST_DEVICE double pow2_scale(double max_abs) { return max_abs > 0.0 ? ldexp(1.0, -ilogb(max_abs) - 1) : 1.0; }

template <typename DT>
DIHAL_HOST_DEVICE DT infinity() {
  return DT(INFINITY);
}

// A sorted list of the `cap` smallest (distance, index) pairs seen, at dist[0..cap) / idx[0..cap);
// empty slots hold +inf and index -1, so the threshold is +inf until the list is full.
template <typename DT, typename IT>
struct CandidateList {
  DT* dist;
  IT* idx;
  int cap;

  DIHAL_HOST_DEVICE void clear() const {
    for (int c = 0; c < cap; ++c) {
      dist[c] = infinity<DT>();
      idx[c] = -1;
    }
  }
  DIHAL_HOST_DEVICE DT threshold() const { return dist[cap - 1]; }
  // Inserts (d, j) with d < threshold(); equal distances keep the earlier entry first.
  DIHAL_HOST_DEVICE void insert(DT d, IT j) const {
    int pos = cap - 1;
    while (pos > 0 && dist[pos - 1] > d) {
      dist[pos] = dist[pos - 1];
      idx[pos] = idx[pos - 1];
      --pos;
    }
    dist[pos] = d;
    idx[pos] = j;
  }
};

// Offers references r0 + j, j in [j_begin, j_end), to the list of query `self`: dots[j * stride]
// is <x_self, x_{r0 + j}> (stride 1 for a row-major tile row, the leading dimension for a
// column-major cuBLAS tile).
template <typename DT, typename IT>
DIHAL_HOST_DEVICE void scan_tile(const DT* dots, int64_t stride, DT q_norm, const DT* ref_norms, int64_t r0,
                                 int64_t j_begin, int64_t j_end, int64_t self, const CandidateList<DT, IT>& list) {
  DT thr = list.threshold();
  for (int64_t j = j_begin; j < j_end; ++j) {
    const DT d = q_norm + ref_norms[j] - DT(2) * dots[j * stride];
    if (d < thr && r0 + j != self) {
      list.insert(d, IT(r0 + j));
      thr = list.threshold();
    }
  }
}

// Merges `parts` sorted lists of `cap` entries (part p at dist[p * cap], idx[p * cap]) into the
// `cap` smallest by (distance, index). The merged threshold out.threshold() is at most the
// threshold of every full part, so every point left out has an approximate distance >= it.
template <typename DT, typename IT>
DIHAL_HOST_DEVICE void merge_lists(const DT* dist, const IT* idx, int parts, int cap, const CandidateList<DT, IT>& out) {
  constexpr int kMaxParts = 64;
  int cursor[kMaxParts];
  for (int p = 0; p < parts; ++p) cursor[p] = 0;
  for (int c = 0; c < cap; ++c) {
    int best = -1;
    for (int p = 0; p < parts; ++p) {
      if (cursor[p] >= cap) continue;
      const int64_t e = int64_t(p) * cap + cursor[p];
      if (idx[e] < 0) continue;  // empty slot: the rest of this part is empty too
      if (best < 0) {
        best = p;
        continue;
      }
      const int64_t b = int64_t(best) * cap + cursor[best];
      if (dist[e] < dist[b] || (dist[e] == dist[b] && idx[e] < idx[b])) best = p;
    }
    if (best < 0) {
      out.dist[c] = infinity<DT>();
      out.idx[c] = -1;
      continue;
    }
    const int64_t b = int64_t(best) * cap + cursor[best]++;
    out.dist[c] = dist[b];
    out.idx[c] = idx[b];
  }
}

// Position of candidate e when the candidates are sorted by (exact distance, index, slot): a
// permutation of 0..cap-1 (valid candidates have distinct indices; the slot only orders empty ones).
template <typename IT>
DIHAL_HOST_DEVICE int rank_of(const double* exact, const IT* cand, int cap, int e) {
  int r = 0;
  for (int f = 0; f < cap; ++f)
    r += exact[f] < exact[e] || (exact[f] == exact[e] && (cand[f] < cand[e] || (cand[f] == cand[e] && f < e)));
  return r;
}

// ---------------------------------------------------------------- the certificate
// A proven a-posteriori bound, in the units of the approximate distances ("scaled units": the
// rows centred at the float64 mean mu and multiplied by the power of two s, so |value| < 1).
//
// Notation. y_i = s (x_i - mu) exactly (real arithmetic); xh_i = the row the GEMM reads (y_i
// rounded: centring in float64, the exact scaling, rounding to the working type W); a = ||xh_i||,
// b = ||xh_j||; t = ||y_i - y_j||^2 = s^2 ||x_i - x_j||^2 (mu cancels exactly), Dh = ||xh_i - xh_j||^2.
// The approximate distance is dt = fl(n_i + n_j - 2 g) with n_i the computed squared norm of xh_i
// and g the computed dot product <xh_i, xh_j>; the exact distance is E = fl64(||x_i - x_j||^2).
// gamma_m(u) = m u / (1 - m u) (Higham, Accuracy and Stability, 2nd ed., 3.1).
//
// Error model (ErrorModel; u_W, u_64 unit roundoffs, L the accumulation length, here always D):
//  (0) arithmetic: IEEE operations in W and float64 rounded to nearest, with gradual underflow. Flush-to-zero
//              (FTZ / DAZ: nvcc -ftz=true or --use_fast_math, -ffast-math's startup code, reduced-precision
//              or emulated GEMMs such as TF32, bf16x9 or fixed point) is outside the proof: the kernels are
//              built without it, cuBLAS computes in PEDANTIC mode (cuda/cublas.hpp) and the CUDA backend
//              refuses cuBLAS's emulation environment variables.
//  (1) input:  xh_c = y_c (1 + d_c) + e_c, |d_c| <= rho, |e_c| <= half the smallest subnormal of W,
//              so || xh_i - y_i || <= rho' a + e with rho' = rho / (1 - rho), e = sqrt(D) 2^-emin.
//              rho = (1 + u_64)(1 + u_W) - 1 (float64 centring, then rounding to W).
//  (2) dot:    |g - <xh_i, xh_j>| <= dot a b. For any summation order in W (recursive, blocked,
//              split-K, pairwise, with or without FMA) |fl(x.y) - x.y| <= gamma_L(u_W) sum |x_c y_c|
//              <= gamma_L(u_W) a b (Cauchy-Schwarz); L = D bounds the depth of every order.
//  (3) norms:  |n_i - a^2| <= eta a^2; float64 sum of squares (gamma_D(u_64)) rounded to W (u_W).
//  (4) sum:    dt = the three-term sum n_i + n_j - 2 g rounded in any order (2 g is exact): its error
//              is <= gamma_2(u_W) (n_i + n_j + 2 |g|) (Higham 4.2) <= asm ((1 + eta)(a^2 + b^2) + 2 (1 + dot) a b).
//  (5) exact:  |E s^2 - t| <= exact t, exact = gamma_{D+2}(u_64) (a rounded difference, a rounded
//              square, D - 1 additions of non-negative terms in any order).
// From (1), | sqrt(Dh) - sqrt(t) | <= r := rho' (a + b) + 2 e, so |Dh - t| <= r (sqrt(Dh) + sqrt(t));
// from (2)-(4), |dt - Dh| <= eta (a^2 + b^2) + 2 dot a b + asm (...). Together |dt - t| <= F(a, b, t),
// increasing in a, b and t.
//
// The certificate. Let K = E_k s^2 be the k-th exact distance of the re-ranked candidates, thr
// the list threshold (every point not re-ranked has dt >= thr). Suppose such a point j has E_j <= E_k
// (it would belong to the answer, or tie). Then t_j <= T := K / (1 - exact); ||xh_j|| <= a + sqrt(Dh)
// and sqrt(Dh) <= sqrt(T) + rho' (2 a + sqrt(Dh)) + 2 e give b <= b_max := min(M, a + (sqrt(T) +
// 2 rho' a + 2 e) / (1 - rho')), M the largest norm; so dt_j <= T + F(a, b_max, T) =: limit. Hence
// thr > limit proves E_j > E_k for every such j: the k re-ranked best are the exact answer, ties to
// the lower index included. a and M enter as upper bounds (the computed norms over 1 - eta), and
// the limit is rounded up to cover its own float64 evaluation (a few operations, far below 64 u_64).
// The old estimate (4 sqrt(D) + 8) u_W (a^2 + M^2) was a typical case, not a bound: a sequential
// FMA dot product of D equal terms errs by O(D u_W) (tests/test_knn_certificate.py builds such rows).
struct ErrorModel {
  double input;     // rho of (1)
  double input_abs; // e of (1)
  double dot;       // (2), relative to a b
  double norm;      // eta of (3)
  double assemble;  // gamma_2 of (4)
  double exact;     // (5)
  double tiny;      // absolute slack for subnormal products and sums in W: (4 D + 8) times its smallest subnormal
};

DIHAL_HOST_DEVICE double gamma_n(double m, double u) { return m * u / (1.0 - m * u); }

// Unit roundoff and smallest subnormal of float and double.
constexpr double kUnit32 = 5.9604644775390625e-08, kUnit64 = 1.1102230246251565e-16;
constexpr double kDenorm32 = 1.4012984643248171e-45, kDenorm64 = 4.9406564584124654e-324;

DIHAL_HOST_DEVICE ErrorModel model_from(int64_t D, double rho, double dot, double norm_unit, double asm_unit,
                                        double denorm) {
  const double d = double(D);
  ErrorModel m;
  m.input = rho;
  m.input_abs = sqrt(d) * denorm;
  m.dot = dot;
  m.norm = gamma_n(d, kUnit64) + norm_unit * (1.0 + gamma_n(d, kUnit64));
  m.assemble = gamma_n(2.0, asm_unit);
  m.exact = gamma_n(d + 2.0, kUnit64);
  m.tiny = (4.0 * d + 8.0) * denorm;
  return m;
}

// The GEMM path of the CPU kernel, the CUDA kernel and its emulation: rows rounded to W (unit
// roundoff unit_w: float or double), dot products from a GEMM accumulating in W in any order
// (OpenBLAS, cuBLAS with CUBLAS_COMPUTE_32F / Dgemm and no TF32, the emulation's sequential FMA),
// norms in float64 rounded to W, the sum in W.
DIHAL_HOST_DEVICE ErrorModel gemm_model(int64_t D, bool double_work) {
  const double u = double_work ? kUnit64 : kUnit32;
  return model_from(D, (1.0 + kUnit64) * (1.0 + u) - 1.0, gamma_n(double(D), u), u, u,
                    double_work ? kDenorm64 : kDenorm32);
}

// Candidates from the float64 centred Gram matrix G = fl(Xc Xc^T), Xc = fl64(x - mu), no scaling:
// G_ij and the norms G_ii are float64 dot products of length D, the sum in float64.
DIHAL_HOST_DEVICE ErrorModel gram_model(int64_t D) {
  ErrorModel m = model_from(D, kUnit64, gamma_n(double(D), kUnit64), 0.0, kUnit64, kDenorm64);
  m.norm = gamma_n(double(D), kUnit64);
  return m;
}

// cuVS brute force (L2Expanded) on the float32 scaled rows: its own norms and dot products. On
// sm_80+ the products may be 3xTF32 (each product split into TF32 parts, the small x small part
// dropped: relative error about 2^-21 per term) accumulated on tensor cores, whose float32
// accumulation need not round to nearest. Assumed conservatively: products within 2^-19 |x_c y_c|,
// accumulation and norms with unit 2^-22 (4 u_32) over L = D terms, the sum in float32 with unit
// 2^-22. This is an assumption about cuVS's kernels, not a proof: a plain-TF32 kernel (2^-11 per
// product) is outside it, so bench/gpu_check.sh compares cuVS with the reference on adversarial
// rows with TF32 allowed and not.
DIHAL_HOST_DEVICE ErrorModel cuvs_model(int64_t D) {
  const double u = 4.0 * kUnit32;
  ErrorModel m = model_from(D, (1.0 + kUnit64) * (1.0 + kUnit32) - 1.0, gamma_n(double(D), u) + 0x1p-19, u, u,
                            kDenorm32);
  m.norm = gamma_n(double(D), u);  // computed by cuVS in float32 from the rows
  return m;
}

// The value the list threshold must exceed to certify row i (derivation above): kth_scaled = E_k s^2,
// norm_i the computed squared norm of row i, max_norm2 the largest computed squared norm (scaled units).
DIHAL_HOST_DEVICE double certify_limit(const ErrorModel& m, double kth_scaled, double norm_i, double max_norm2) {
  const double a = sqrt(fmax(norm_i, 0.0) / (1.0 - m.norm));
  const double M = sqrt(fmax(max_norm2, 0.0) / (1.0 - m.norm));
  const double T = kth_scaled / (1.0 - m.exact);
  const double sT = sqrt(T);
  const double rp = m.input / (1.0 - m.input);
  const double b = fmin(M, a + (sT + 2.0 * rp * a + 2.0 * m.input_abs) / (1.0 - rp));
  const double r = rp * (a + b) + 2.0 * m.input_abs;
  const double sDh = fmin(a + b, sT + r);
  const double sq = a * a + b * b, ab = a * b;
  const double F = r * (sDh + sT) + m.norm * sq + 2.0 * m.dot * ab +
                   m.assemble * ((1.0 + m.norm) * sq + 2.0 * (1.0 + m.dot) * ab) + m.tiny;
  return (T + F) * (1.0 + 64.0 * kUnit64);
}

// Whether the k best candidates are the exact answer: either the candidates are all other rows,
// or the list threshold exceeds the limit of certify_limit.
DIHAL_HOST_DEVICE bool certified(bool complete, double threshold, double limit) {
  return complete || (threshold < INFINITY && threshold > limit);
}

}  // namespace dihal::knn_logic
