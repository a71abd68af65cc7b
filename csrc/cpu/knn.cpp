// Exact kNN: tiled distance products (GEMM in the input precision on mean-centred data) with a
// fused per-row candidate list, then an exact float64 re-rank. A row whose float64 answer cannot be
// certified from the candidates (some rejected point's approximate distance does not exceed the
// k-th exact distance plus the proven rounding bound of knn_logic::certify_limit) is recomputed
// exactly against all rows. The logic shared with the CUDA kernels (scaling, candidate lists,
// certificate) is csrc/knn_logic.hpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>

#include "blas.hpp"
#include "kernels.hpp"
#include "knn_logic.hpp"
#include "nvtx.hpp"

namespace dihal {
namespace {

namespace kl = knn_logic;
template <typename T>
using List = kl::CandidateList<T, int64_t>;

constexpr int64_t kQueryBlock = 256;
constexpr int64_t kRefBlock = 2048;

// ---------------------------------------------------------------- preparation
// The rows of X centred in float64, scaled by knn_logic::pow2_scale and rounded to W, their squared
// norms (float64 sums rounded to W) and the largest one. The row loops are compiled for AVX-512 and
// AVX2 as well as the baseline (target_clones); the norms' sums run in vector lanes, an order that
// the float64 sum-of-squares bound of ErrorModel (3) covers.
template <typename W>
struct Scaled {
  std::unique_ptr<W[]> rows;  // n x D, written before it is read (no clearing pass)
  std::vector<W> norms;       // n
  double scale;
  double max_norm2;
  const W* centred() const { return rows.get(); }
};

template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
void add_rows(const T* X, int64_t rows, int64_t D, int64_t c0, int64_t c1, double* sum) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = X + r * D;
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) sum[c] += double(x[c]);
  }
}

template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
double max_deviation(const T* x, const double* mean, int64_t D) {
  double best = 0.0;
#pragma omp simd reduction(max : best)
  for (int64_t c = 0; c < D; ++c) {
    const double v = std::fabs(double(x[c]) - mean[c]);
    best = v > best ? v : best;
  }
  return best;
}

template <typename T, typename W>
__attribute__((target_clones("avx512f", "avx2", "default")))
double scale_row(const T* x, const double* mean, double scale, int64_t D, W* out) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < D; ++c) {
    const W v = W((double(x[c]) - mean[c]) * scale);
    out[c] = v;
    s += double(v) * double(v);
  }
  return s;
}

template <typename T, typename W>
Scaled<W> centre_and_scale(const T* X, int64_t n, int64_t D, bool parallel) {
  std::vector<double> mean(size_t(D), 0.0);
  // Column ranges per thread: each column's sum runs over the rows in order, as a serial loop's would.
#pragma omp parallel if(parallel)
  {
    const int64_t t = omp_get_thread_num(), parts = omp_get_num_threads();
    const int64_t c0 = D * t / parts, c1 = D * (t + 1) / parts;
    add_rows(X, n, D, c0, c1, mean.data());
  }
  for (double& m : mean) m /= double(n);
  double max_abs = 0.0;
#pragma omp parallel for schedule(static) reduction(max : max_abs) if(parallel)
  for (int64_t r = 0; r < n; ++r) max_abs = std::max(max_abs, max_deviation(X + r * D, mean.data(), D));
  Scaled<W> out{std::unique_ptr<W[]>(new W[size_t(n) * size_t(D)]), std::vector<W>(size_t(n)), kl::pow2_scale(max_abs),
                0.0};
  double max_norm2 = 0.0;
#pragma omp parallel for schedule(static) reduction(max : max_norm2) if(parallel)
  for (int64_t r = 0; r < n; ++r) {
    const double s = scale_row(X + r * D, mean.data(), out.scale, D, out.rows.get() + r * D);
    out.norms[size_t(r)] = W(s);
    max_norm2 = std::max(max_norm2, s);
  }
  out.max_norm2 = max_norm2;
  return out;
}

// ---------------------------------------------------------------- candidates

// The approximate distances na + norms[b] - 2 g[b] of one tile row that are below thr_row or below
// thr_cols[b]: their positions b to flagged[] and values to dist[], in order; returns their count.
// Most columns enter no list, so this vectorised filter does the bulk of the scan and the list
// insertions see only the few that pass.
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
int64_t flag_candidates(const T* g, const T* norms, const T* thr_cols, int64_t nj, T na, T thr_row, T* dist,
                        int32_t* flagged) {
  constexpr int64_t kChunk = 64;
  T d[kChunk];
  int64_t count = 0;
  for (int64_t b0 = 0; b0 < nj; b0 += kChunk) {
    const int64_t len = std::min(kChunk, nj - b0);
    int any = 0;
#pragma omp simd reduction(| : any)
    for (int64_t b = 0; b < len; ++b) {
      d[b] = na + norms[b0 + b] - T(2) * g[b0 + b];
      any |= int(d[b] < thr_row) | int(d[b] < thr_cols[b0 + b]);
    }
    if (!any) continue;
    for (int64_t b = 0; b < len; ++b)
      if (d[b] < thr_row || d[b] < thr_cols[b0 + b]) {
        dist[count] = d[b];
        flagged[count++] = int32_t(b0 + b);
      }
  }
  return count;
}

// Sorts (distance, index) pairs by distance, then index, and keeps the first k.
void sort_pairs(std::vector<std::pair<double, int64_t>>& v, int64_t k) {
  const auto less = [](const auto& x, const auto& y) { return x.first < y.first || (x.first == y.first && x.second < y.second); };
  if (int64_t(v.size()) > k) {
    std::nth_element(v.begin(), v.begin() + k, v.end(), less);
    v.resize(size_t(k));
  }
  std::sort(v.begin(), v.end(), less);
}

// The per-row candidate lists (n x cap, cleared): row i's list is list(i).
template <typename T>
struct CandidateSets {
  std::vector<T> dist;
  std::vector<int64_t> idx;
  int64_t cap;

  CandidateSets(int64_t rows, int64_t cap) : dist(size_t(rows) * size_t(cap)), idx(dist.size()), cap(cap) {
    for (int64_t r = 0; r < rows; ++r) list(r).clear();
  }
  List<T> list(int64_t row) { return List<T>{dist.data() + row * cap, idx.data() + row * cap, int(cap)}; }
};

// Candidate lists row by row: each thread owns a block of query rows (no sharing).
template <typename T>
void rowwise_candidates(const Scaled<T>& s, int64_t n, int64_t D, CandidateSets<T>& out) {
  const int64_t n_qblocks = (n + kQueryBlock - 1) / kQueryBlock;
#pragma omp parallel if(parallel_worth(double(n) * double(n) * double(D)))
  {
    std::vector<T> tile(size_t(kQueryBlock) * size_t(kRefBlock));
#pragma omp for schedule(dynamic, 1)
    for (int64_t qb = 0; qb < n_qblocks; ++qb) {
      const int64_t q0 = qb * kQueryBlock, nq = std::min(kQueryBlock, n - q0);
      for (int64_t r0 = 0; r0 < n; r0 += kRefBlock) {
        const int64_t nr = std::min(kRefBlock, n - r0);
        blas::gemm_abt(int(nq), int(nr), int(D), s.centred() + q0 * D, s.centred() + r0 * D, tile.data(), int(nr));
        for (int64_t q = 0; q < nq; ++q)
          kl::scan_tile(tile.data() + q * nr, 1, s.norms[q0 + q], s.norms.data() + r0, r0, 0, nr, q0 + q, out.list(q0 + q));
      }
    }
  }
}

// Candidate lists from the upper triangle of block pairs only (half the GEMM work): each tile
// updates the lists of its rows and of its columns. Threads keep private lists, merged at the end.
template <typename T>
void symmetric_candidates(const Scaled<T>& s, int64_t n, int64_t D, CandidateSets<T>& out) {
  constexpr int64_t B = 512;
  const int64_t nb = (n + B - 1) / B;
  std::vector<std::pair<int64_t, int64_t>> tiles;
  for (int64_t I = 0; I < nb; ++I)
    for (int64_t J = I; J < nb; ++J) tiles.emplace_back(I, J);
  const bool parallel = parallel_worth(double(n) * double(n) * double(D));
  const int nthreads = parallel ? omp_get_max_threads() : 1;
  std::vector<CandidateSets<T>> own(size_t(nthreads), CandidateSets<T>(0, out.cap));
#pragma omp parallel num_threads(nthreads) if(parallel)
  {
    CandidateSets<T>& mine = own[size_t(omp_get_thread_num())];
    mine = CandidateSets<T>(n, out.cap);
    std::vector<T> thr(size_t(n), kl::infinity<T>());  // cached thresholds of mine
    std::vector<T> tile(size_t(B) * size_t(B)), dist(static_cast<size_t>(B));
    std::vector<int32_t> flagged(static_cast<size_t>(B));
    const auto offer = [&](int64_t row, T d, int64_t col) {
      const List<T> l = mine.list(row);
      l.insert(d, col);
      thr[size_t(row)] = l.threshold();
    };
#pragma omp for schedule(dynamic, 1)
    for (size_t p = 0; p < tiles.size(); ++p) {
      const int64_t i0 = tiles[p].first * B, j0 = tiles[p].second * B;
      const int64_t ni = std::min(B, n - i0), nj = std::min(B, n - j0);
      const bool diagonal = i0 == j0;
      // A diagonal tile is the upper triangle of its rows' Gram matrix (a SYRK, half the flops): row a
      // meets the columns b > a only, each pair once, and offers it to both lists as off the diagonal.
      if (diagonal)
        blas::syrk_upper(false, int(ni), int(D), s.centred() + i0 * D, int(D), tile.data(), int(nj));
      else
        blas::gemm_abt(int(ni), int(nj), int(D), s.centred() + i0 * D, s.centred() + j0 * D, tile.data(), int(nj));
      for (int64_t a = 0; a < ni; ++a) {
        const int64_t row = i0 + a, b0 = diagonal ? a + 1 : 0;
        const T* g = tile.data() + a * nj + b0;
        const T na = s.norms[size_t(row)];
        // Vector pass: the columns that may enter either list, judged with the thresholds as they
        // are now (they only decrease, so this is a superset), then the offers in column order as
        // a plain scan would make them.
        const int64_t count = flag_candidates(g, s.norms.data() + j0 + b0, thr.data() + j0 + b0, nj - b0, na,
                                              thr[size_t(row)], dist.data(), flagged.data());
        for (int64_t f = 0; f < count; ++f) {
          const int64_t col = j0 + b0 + flagged[size_t(f)];
          const T d = dist[size_t(f)];
          if (d < thr[size_t(row)]) offer(row, d, col);
          if (d < thr[size_t(col)]) offer(col, d, row);
        }
      }
    }
  }
  // Merge the threads' sorted lists row by row: the cap smallest by distance, ties to the lower
  // thread (what inserting thread 0's list, then thread 1's, ... would keep). One thread: no merge.
  if (own.size() == 1) {
    std::swap(out, own[0]);
    return;
  }
#pragma omp parallel if(parallel)
  {
    std::vector<int> cursor(own.size());
#pragma omp for schedule(static)
    for (int64_t row = 0; row < n; ++row) {
      const List<T> merged = out.list(row);
      std::fill(cursor.begin(), cursor.end(), 0);
      for (int c = 0; c < merged.cap; ++c) {
        int best = -1;
        T best_d = kl::infinity<T>();
        for (size_t t = 0; t < own.size(); ++t) {
          const List<T> l = own[t].list(row);
          if (cursor[t] < l.cap && l.idx[cursor[t]] >= 0 && (best < 0 || l.dist[cursor[t]] < best_d)) {
            best = int(t);
            best_d = l.dist[cursor[t]];
          }
        }
        if (best < 0) break;  // every list is exhausted; the rest of merged stays empty
        const List<T> l = own[size_t(best)].list(row);
        merged.dist[c] = best_d;
        merged.idx[c] = l.idx[cursor[size_t(best)]++];
      }
    }
  }
}

template <typename T>
inline void prefetch_row(const T* row, int64_t D) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < D * int64_t(sizeof(T)); b += 64) __builtin_prefetch(p + b);
}

// Exact re-rank in float64 of each row's candidates, certified by knn_logic::certify_limit under
// the error model of the path that made the candidates (distances in units of `unit2` times the
// exact ones); otherwise exact brute force. The candidates come sorted by approximate distance, so
// the exact distances are computed in that order and stop at the first candidate whose approximate
// distance exceeds the limit of the k-th exact one found: neither it nor any later candidate nor
// any rejected point (approximate distances at least its own) can be among the k nearest. This is
// the certificate of knn_logic::certified with that candidate's distance as the threshold, and the
// answer is the one a re-rank of every candidate gives (usually after k + 1 or k + 2 of them).
template <typename T, typename DT>
void rerank(const T* X, int64_t n, int64_t D, int64_t k, CandidateSets<DT>& sets, const DT* norms, double max_norm2,
            const kl::ErrorModel& model, double unit2, int64_t* out_idx, double* out_d2, int64_t* recomputed) {
  const int64_t cap = sets.cap;
  const auto less = [](const auto& x, const auto& y) { return x.first < y.first || (x.first == y.first && x.second < y.second); };
  int64_t uncertified = 0;
#pragma omp parallel if(parallel_worth(double(n) * double(k + 2) * double(D)))
  {
    std::vector<std::pair<double, int64_t>> pairs;
#pragma omp for schedule(dynamic, 16) reduction(+ : uncertified)
    for (int64_t i = 0; i < n; ++i) {
      const T* xi = X + i * D;
      const List<DT> list = sets.list(i);
      const auto limit = [&] { return kl::certify_limit(model, pairs[size_t(k - 1)].first * unit2, double(norms[i]), max_norm2); };
      pairs.clear();
      bool certified = false;
      for (int c = 0; c < list.cap && list.idx[c] >= 0; ++c) {
        if (int64_t(pairs.size()) >= k && double(list.dist[c]) > limit()) {
          certified = true;
          break;
        }
        // The candidates are scattered rows of X, mostly outside the core's cache: the next one's
        // lines are requested while this one's distance runs.
        if (c + 1 < list.cap && list.idx[c + 1] >= 0) prefetch_row(X + list.idx[c + 1] * D, D);
        const std::pair<double, int64_t> p(sqdist_exact(xi, X + list.idx[c] * D, D), list.idx[c]);
        pairs.insert(std::upper_bound(pairs.begin(), pairs.end(), p, less), p);  // kept sorted
      }
      certified = certified ||
                  (int64_t(pairs.size()) >= k && kl::certified(cap == n - 1, double(list.threshold()), limit()));
      if (!certified) {
        ++uncertified;
        pairs.clear();
        for (int64_t j = 0; j < n; ++j)
          if (j != i) pairs.emplace_back(sqdist_exact(xi, X + j * D, D), j);
      }
      sort_pairs(pairs, k);
      for (int64_t c = 0; c < k; ++c) {
        out_idx[i * k + c] = pairs[size_t(c)].second;
        out_d2[i * k + c] = pairs[size_t(c)].first;
      }
    }
  }  if (recomputed) *recomputed = uncertified;
}

}  // namespace

template <typename T>
void knn(const T* X, int64_t n, int64_t D, int64_t k, int64_t* out_idx, double* out_d2, bool symmetric,
         int64_t* recomputed) {
  DIHAL_NVTX_RANGE("dihal/knn");
  const int64_t cap = kl::capacity(n, k);
  const Scaled<T> s = centre_and_scale<T, T>(X, n, D, parallel_worth(double(n) * double(D)));
  CandidateSets<T> sets(n, cap);
  const size_t private_bytes = size_t(omp_get_max_threads()) * size_t(n) * size_t(cap) * (sizeof(T) + 8);
  if (symmetric && private_bytes <= (size_t(512) << 20))
    symmetric_candidates(s, n, D, sets);
  else
    rowwise_candidates(s, n, D, sets);
  rerank(X, n, D, k, sets, s.norms.data(), s.max_norm2, kl::gemm_model(D, std::is_same_v<T, double>), s.scale * s.scale,
         out_idx, out_d2, recomputed);
}

template <typename T>
void knn_from_gram(const T* X, int64_t n, int64_t D, const double* G, int64_t k, int64_t* out_idx, double* out_d2) {
  DIHAL_NVTX_RANGE("dihal/knn");
  const int64_t cap = kl::capacity(n, k);
  std::vector<double> norms(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) norms[size_t(i)] = G[i * n + i];
  const double max_norm2 = *std::max_element(norms.begin(), norms.end());
  CandidateSets<double> sets(n, cap);
#pragma omp parallel for schedule(static) if(parallel_worth(double(n) * double(n)))
  for (int64_t i = 0; i < n; ++i) kl::scan_tile(G + i * n, 1, norms[size_t(i)], norms.data(), 0, 0, n, i, sets.list(i));
  rerank(X, n, D, k, sets, norms.data(), max_norm2, kl::gram_model(D), 1.0, out_idx, out_d2, nullptr);
}

template void knn<float>(const float*, int64_t, int64_t, int64_t, int64_t*, double*, bool, int64_t*);
template void knn<double>(const double*, int64_t, int64_t, int64_t, int64_t*, double*, bool, int64_t*);
template void knn_from_gram<float>(const float*, int64_t, int64_t, const double*, int64_t, int64_t*, double*);
template void knn_from_gram<double>(const double*, int64_t, int64_t, const double*, int64_t, int64_t*, double*);

}  // namespace dihal
