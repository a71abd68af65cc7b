// Per-thread logic of the CUDA kNN, shared by the kernels (knn.cu) and by a host emulation of the
// whole pipeline (knn_emulation.cpp) that tests this logic on machines without a GPU.
//
// Pipeline (mirrors the CPU kernel, csrc/cpu/knn.cpp): rows are centred and scaled by a power of
// two so that |value| <= 1, rounded to the working type W (float, or double for float64 input);
// tiles of dot products come from cuBLAS; each (query, split of the reference columns) keeps a
// sorted list of its `cap` smallest approximate distances; the lists of a query are merged; the
// candidates are re-ranked with exact float64 distances on the original rows, and the answer is
// certified when the k-th exact distance is below every rejected point's approximate distance
// minus the rounding bound. Uncertified rows are recomputed exactly by the caller.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#ifdef __CUDACC__
#define DIHAL_HD __host__ __device__ inline
#else
#define DIHAL_HD inline
#endif

namespace dihal::cuda::knn_logic {

// Candidates kept per row: the same rule as the CPU kernel.
DIHAL_HD int64_t capacity(int64_t n, int64_t k) {
  const int64_t extra = k / 2 > 16 ? k / 2 : 16;
  return k + extra < n - 1 ? k + extra : n - 1;
}

// Relative rounding bound of an approximate squared distance in working precision with unit
// roundoff `unit`, relative to ||x_i||^2 + max_j ||x_j||^2 in scaled units (as the CPU kernel).
DIHAL_HD double rel_bound(int64_t D, double unit) { return (4.0 * sqrt(double(D)) + 8.0) * unit; }

template <typename DT>
DIHAL_HD DT infinity() {
  return DT(INFINITY);
}

// A sorted list of the `cap` smallest (distance, index) pairs seen, at dist[0..cap) / idx[0..cap);
// empty slots hold +inf and index -1, so the threshold is +inf until the list is full.
template <typename DT>
struct CandidateList {
  DT* dist;
  int32_t* idx;
  int cap;

  DIHAL_HD void clear() const {
    for (int c = 0; c < cap; ++c) {
      dist[c] = infinity<DT>();
      idx[c] = -1;
    }
  }
  DIHAL_HD DT threshold() const { return dist[cap - 1]; }
  // Inserts (d, j) with d < threshold(); equal distances keep the earlier entry first.
  DIHAL_HD void insert(DT d, int32_t j) const {
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

// Scans reference columns [j_begin, j_end) of a transposed tile of dot products
// (tile[j * ld + q] = <x_q, x_{r0 + j}>) for query q and offers them to its list.
template <typename DT>
DIHAL_HD void scan_tile(const DT* tile, int64_t ld, int64_t q, DT q_norm, const DT* ref_norms, int64_t r0,
                        int64_t j_begin, int64_t j_end, int64_t self, const CandidateList<DT>& list) {
  DT thr = list.threshold();
  for (int64_t j = j_begin; j < j_end; ++j) {
    const DT d = q_norm + ref_norms[j] - DT(2) * tile[j * ld + q];
    if (d < thr && r0 + j != self) {
      list.insert(d, int32_t(r0 + j));
      thr = list.threshold();
    }
  }
}

// Merges `parts` sorted lists of `cap` entries (part p at dist[p * cap], idx[p * cap]) into the
// `cap` smallest by (distance, index). The merged threshold out.threshold() is at most the
// threshold of every full part, so every point left out has an approximate distance >= it.
template <typename DT>
DIHAL_HD void merge_lists(const DT* dist, const int32_t* idx, int parts, int cap, const CandidateList<DT>& out) {
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
DIHAL_HD int rank_of(const double* exact, const int32_t* cand, int cap, int e) {
  int r = 0;
  for (int f = 0; f < cap; ++f)
    r += exact[f] < exact[e] ||
         (exact[f] == exact[e] && (cand[f] < cand[e] || (cand[f] == cand[e] && f < e)));
  return r;
}

// Whether the k best candidates are the exact answer: either the candidates are all other rows,
// or the k-th exact distance (scaled like the approximate ones) is below the threshold minus the
// rounding bound, so no rejected point can be closer.
DIHAL_HD bool certified(bool complete, double kth_exact_scaled, double threshold, double bound) {
  return complete || (threshold < INFINITY && kth_exact_scaled < threshold - bound);
}

}  // namespace dihal::cuda::knn_logic
