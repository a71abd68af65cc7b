// The exact kNN logic shared by the CPU kernel (cpu/knn.cpp), the CUDA kernels (cuda/knn.cu) and
// the host emulation of the CUDA pipeline (cpu/knn_emulation.cpp), so that all three compute the
// same function with the same rounding bound.
//
// Pipeline: rows are centred and scaled by a power of two so that |value| <= 1, rounded to the
// working type W (float, or double for float64 input); tiles of dot products come from a GEMM
// (OpenBLAS or cuBLAS); each query keeps a sorted list of its `cap` smallest approximate distances
// (on the GPU one list per split of the reference columns, merged afterwards); the candidates are
// re-ranked with exact float64 distances on the original rows, and the answer is certified when
// the k-th exact distance is below every rejected point's approximate distance minus the rounding
// bound. Uncertified rows are recomputed exactly against all rows.
#pragma once
#include <cmath>
#include <cstdint>

#include "host_device.hpp"

#ifndef __CUDACC__
#include <algorithm>
#include <vector>
#endif

namespace dihal::knn_logic {

// Candidates kept per row.
DIHAL_HOST_DEVICE int64_t capacity(int64_t n, int64_t k) {
  const int64_t extra = k / 2 > 16 ? k / 2 : 16;
  return k + extra < n - 1 ? k + extra : n - 1;
}

// 2^-(e+1) for the largest |x - mean| = f 2^e (f in [1, 2)): every scaled value is below 1, and
// the scaling is exact.
DIHAL_HOST_DEVICE double pow2_scale(double max_abs) { return max_abs > 0.0 ? ldexp(1.0, -ilogb(max_abs) - 1) : 1.0; }

// Relative rounding bound of an approximate squared distance (a dot product of length D in a
// working precision with unit roundoff `unit`, plus the norms and the final sum), relative to
// ||x_i||^2 + max_j ||x_j||^2 in scaled units.
DIHAL_HOST_DEVICE double rel_bound(int64_t D, double unit) { return (4.0 * sqrt(double(D)) + 8.0) * unit; }

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

// Rounding bound of the approximate distances of row i (scaled units).
DIHAL_HOST_DEVICE double distance_bound(double rel, double norm_i, double max_norm2) { return rel * (norm_i + max_norm2); }

// Whether the k best candidates are the exact answer: either the candidates are all other rows,
// or the k-th exact distance (scaled like the approximate ones) is below the threshold minus the
// rounding bound, so no rejected point can be closer.
DIHAL_HOST_DEVICE bool certified(bool complete, double kth_exact_scaled, double threshold, double bound) {
  return complete || (threshold < INFINITY && kth_exact_scaled < threshold - bound);
}

#ifndef __CUDACC__
// Host preparation (the CUDA kernels do the same on the device): the rows of X centred in float64,
// scaled by pow2_scale and rounded to W, their squared norms (rounded to W) and the largest one.
template <typename W>
struct Scaled {
  std::vector<W> centred;  // n x D
  std::vector<W> norms;    // n
  double scale;
  double max_norm2;
};

template <typename T, typename W>
Scaled<W> centre_and_scale(const T* X, int64_t n, int64_t D, bool parallel) {
  std::vector<double> mean(size_t(D), 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) mean[size_t(c)] += double(X[r * D + c]);
  for (double& m : mean) m /= double(n);
  double max_abs = 0.0;
#pragma omp parallel for schedule(static) reduction(max : max_abs) if(parallel)
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) max_abs = std::max(max_abs, std::fabs(double(X[r * D + c]) - mean[size_t(c)]));
  Scaled<W> out{std::vector<W>(size_t(n) * size_t(D)), std::vector<W>(size_t(n)), pow2_scale(max_abs), 0.0};
  double max_norm2 = 0.0;
#pragma omp parallel for schedule(static) reduction(max : max_norm2) if(parallel)
  for (int64_t r = 0; r < n; ++r) {
    double s = 0.0;
    for (int64_t c = 0; c < D; ++c) {
      const W v = W((double(X[r * D + c]) - mean[size_t(c)]) * out.scale);
      out.centred[size_t(r * D + c)] = v;
      s += double(v) * double(v);
    }
    out.norms[size_t(r)] = W(s);
    max_norm2 = std::max(max_norm2, s);
  }
  out.max_norm2 = max_norm2;
  return out;
}
#endif

}  // namespace dihal::knn_logic
