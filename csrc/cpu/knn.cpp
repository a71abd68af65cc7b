// Exact kNN: tiled distance products (GEMM in the input precision on mean-centred data) with a
// fused per-row candidate list, then an exact float64 re-rank. A row whose float64 answer cannot be
// certified from the candidates (the k-th exact distance is not clearly below every rejected
// point's approximate distance minus the rounding bound) is recomputed exactly against all rows.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "blas.hpp"
#include "kernels.hpp"
#include "nvtx.hpp"

namespace dihal {
namespace {

constexpr int64_t kQueryBlock = 256;
constexpr int64_t kRefBlock = 2048;

// A bounded list of the best (distance, index) pairs, kept sorted by distance ascending.
template <typename T>
struct Candidates {
  T* dist;
  int64_t* idx;
  int64_t size = 0;
  int64_t cap;

  T threshold() const { return size < cap ? std::numeric_limits<T>::infinity() : dist[cap - 1]; }

  void insert(T d, int64_t j) {
    int64_t pos = size < cap ? size++ : cap - 1;
    while (pos > 0 && dist[pos - 1] > d) {
      dist[pos] = dist[pos - 1];
      idx[pos] = idx[pos - 1];
      --pos;
    }
    dist[pos] = d;
    idx[pos] = j;
  }
};

template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
double exact_sqdist(const T* a, const T* b, int64_t D) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < D; ++c) {
    const double d = double(a[c]) - double(b[c]);
    s += d * d;
  }
  return s;
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

// Where the approximate pass writes its per-row candidate lists.
template <typename T>
struct CandidateSets {
  T* dist;
  int64_t* idx;
  T* thr;
  int64_t* count;
  int64_t cap;
};

// Candidate lists row by row: each thread owns a block of query rows (no sharing).
template <typename T>
void rowwise_candidates(const T* Xc, const T* norms, int64_t n, int64_t D, const CandidateSets<T>& out) {
  const int64_t cap = out.cap;
  {
    const int64_t n_qblocks = (n + kQueryBlock - 1) / kQueryBlock;
#pragma omp parallel if(parallel_worth(double(n) * double(n) * double(D)))
    {
      std::vector<T> tile(size_t(kQueryBlock) * size_t(kRefBlock));
#pragma omp for schedule(dynamic, 1)
      for (int64_t qb = 0; qb < n_qblocks; ++qb) {
        const int64_t q0 = qb * kQueryBlock, nq = std::min(kQueryBlock, n - q0);
        std::vector<Candidates<T>> lists(nq);
        for (int64_t q = 0; q < nq; ++q)
          lists[q] = Candidates<T>{out.dist + (q0 + q) * cap, out.idx + (q0 + q) * cap, 0, cap};
        for (int64_t r0 = 0; r0 < n; r0 += kRefBlock) {
          const int64_t nr = std::min(kRefBlock, n - r0);
          blas::gemm_abt(int(nq), int(nr), int(D), Xc + q0 * D, Xc + r0 * D, tile.data(), int(nr));
          for (int64_t q = 0; q < nq; ++q) {
            Candidates<T>& list = lists[q];
            const T* g = tile.data() + q * nr;
            const T nqn = norms[q0 + q];
            const int64_t self = q0 + q - r0;
            T thr = list.threshold();
            for (int64_t j = 0; j < nr; ++j) {
              const T d = nqn + norms[r0 + j] - T(2) * g[j];
              if (d < thr && j != self) {
                list.insert(d, r0 + j);
                thr = list.threshold();
              }
            }
          }
        }
        for (int64_t q = 0; q < nq; ++q) {
          out.thr[q0 + q] = lists[q].threshold();
          out.count[q0 + q] = lists[q].size;
        }
      }
    }
  }

}

// Candidate lists from the upper triangle of block pairs only (half the GEMM work): each tile
// updates the lists of its rows and of its columns. Threads keep private lists, merged at the end.
template <typename T>
void symmetric_candidates(const T* Xc, const T* norms, int64_t n, int64_t D, const CandidateSets<T>& out) {
  constexpr int64_t B = 512;
  const int64_t cap = out.cap, nb = (n + B - 1) / B;
  std::vector<std::pair<int64_t, int64_t>> tiles;
  for (int64_t I = 0; I < nb; ++I)
    for (int64_t J = I; J < nb; ++J) tiles.emplace_back(I, J);
  const int nthreads = omp_get_max_threads();
  std::vector<T> dist(size_t(nthreads) * size_t(n) * size_t(cap));
  std::vector<int64_t> idx(size_t(nthreads) * size_t(n) * size_t(cap));
  std::vector<int64_t> size(size_t(nthreads) * size_t(n), 0);
  std::vector<T> thr(size_t(nthreads) * size_t(n), std::numeric_limits<T>::infinity());
  {
#pragma omp parallel if(parallel_worth(double(n) * double(n) * double(D)))
    {
      const int t = omp_get_thread_num();
      std::vector<T> tile(size_t(B) * size_t(B));
      const auto list = [&](int64_t row) {
        const size_t base = (size_t(t) * size_t(n) + size_t(row));
        return Candidates<T>{dist.data() + base * cap, idx.data() + base * cap, size[base], cap};
      };
      T* my_thr = thr.data() + size_t(t) * size_t(n);
      int64_t* my_size = size.data() + size_t(t) * size_t(n);
      const auto offer = [&](int64_t row, T d, int64_t col) {
        Candidates<T> l = list(row);
        l.insert(d, col);
        my_size[row] = l.size;
        my_thr[row] = l.threshold();
      };
#pragma omp for schedule(dynamic, 1)
      for (size_t p = 0; p < tiles.size(); ++p) {
        const int64_t i0 = tiles[p].first * B, j0 = tiles[p].second * B;
        const int64_t ni = std::min(B, n - i0), nj = std::min(B, n - j0);
        const bool diagonal = i0 == j0;
        blas::gemm_abt(int(ni), int(nj), int(D), Xc + i0 * D, Xc + j0 * D, tile.data(), int(nj));
        for (int64_t a = 0; a < ni; ++a) {
          const int64_t row = i0 + a;
          const T* g = tile.data() + a * nj;
          const T na = norms[row];
          for (int64_t b = 0; b < nj; ++b) {
            const int64_t col = j0 + b;
            if (diagonal && col == row) continue;
            const T d = na + norms[col] - T(2) * g[b];
            if (d < my_thr[row]) offer(row, d, col);
            if (!diagonal && d < my_thr[col]) offer(col, d, row);
          }
        }
      }
    }
  }
  // Merge the threads' lists row by row.
#pragma omp parallel for schedule(static) if(parallel_worth(double(n) * double(cap) * nthreads))
  for (int64_t row = 0; row < n; ++row) {
    Candidates<T> merged{out.dist + row * cap, out.idx + row * cap, 0, cap};
    for (int t = 0; t < nthreads; ++t) {
      const size_t base = size_t(t) * size_t(n) + size_t(row);
      for (int64_t c = 0; c < size[base]; ++c) {
        const T d = dist[base * cap + c];
        if (d < merged.threshold()) merged.insert(d, idx[base * cap + c]);
      }
    }
    out.thr[row] = merged.threshold();
    out.count[row] = merged.size;
  }
}

}  // namespace

template <typename T>
void knn(const T* X, int64_t n, int64_t D, int64_t k, int64_t* out_idx, double* out_d2, bool symmetric) {
  DIHAL_NVTX_RANGE("dihal/knn");
  const int64_t cap = std::min(n - 1, k + std::max<int64_t>(16, k / 2));

  // Centre in float64 and scale by a power of two so that every value is at most 1 in magnitude
  // (exact, and no overflow of squared norms in the working precision); round to T.
  std::vector<double> mean(D, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) mean[c] += double(X[r * D + c]);
  for (auto& m : mean) m /= double(n);
  double max_abs = 0.0;
#pragma omp parallel for schedule(static) reduction(max : max_abs) if(parallel_worth(double(n) * double(D)))
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) max_abs = std::max(max_abs, std::fabs(double(X[r * D + c]) - mean[c]));
  const double scale = max_abs > 0 ? std::ldexp(1.0, -std::ilogb(max_abs) - 1) : 1.0;
  const double scale2 = scale * scale;
  std::vector<T> Xc(size_t(n) * size_t(D));
  std::vector<T> norms(n);
  double max_norm2 = 0.0;
#pragma omp parallel for schedule(static) reduction(max : max_norm2) if(parallel_worth(double(n) * double(D)))
  for (int64_t r = 0; r < n; ++r) {
    double s = 0.0;
    for (int64_t c = 0; c < D; ++c) {
      const T v = T((double(X[r * D + c]) - mean[c]) * scale);
      Xc[size_t(r * D + c)] = v;
      s += double(v) * double(v);
    }
    norms[r] = T(s);
    max_norm2 = std::max(max_norm2, s);
  }
  // Rounding bound of an approximate squared distance (dot product of length D in precision T,
  // plus the norms and the final sum), relative to ||x_i||^2 + max_j ||x_j||^2 (scaled units).
  const double unit = std::numeric_limits<T>::epsilon() / 2;
  const double rel_bound = (4.0 * std::sqrt(double(D)) + 8.0) * unit;

  std::vector<T> cand_dist(size_t(n) * size_t(cap));
  std::vector<int64_t> cand_idx(size_t(n) * size_t(cap));
  std::vector<T> cand_thr(n);
  std::vector<int64_t> cand_count(n);

  const size_t private_bytes = size_t(omp_get_max_threads()) * size_t(n) * size_t(cap) * (sizeof(T) + 8);
  CandidateSets<T> sets{cand_dist.data(), cand_idx.data(), cand_thr.data(), cand_count.data(), cap};
  if (symmetric && private_bytes <= (size_t(512) << 20))
    symmetric_candidates(Xc.data(), norms.data(), n, D, sets);
  else
    rowwise_candidates(Xc.data(), norms.data(), n, D, sets);

  // Exact re-rank in float64, certified against the rounding bound; otherwise exact brute force.
#pragma omp parallel if(parallel_worth(double(n) * double(cap) * double(D)))
  {
    std::vector<std::pair<double, int64_t>> pairs;
#pragma omp for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; ++i) {
      const T* xi = X + i * D;
      pairs.clear();
      for (int64_t c = 0; c < cand_count[i]; ++c) {
        const int64_t j = cand_idx[size_t(i * cap + c)];
        pairs.emplace_back(exact_sqdist(xi, X + j * D, D), j);
      }
      sort_pairs(pairs, k);
      const bool filled = cand_count[i] == cap && int64_t(pairs.size()) >= k;
      const bool complete = filled && cap == n - 1;
      const double bound = rel_bound * (double(norms[i]) + max_norm2);
      if (!complete && !(filled && pairs[size_t(k - 1)].first * scale2 < double(cand_thr[i]) - bound)) {
        pairs.clear();
        for (int64_t j = 0; j < n; ++j)
          if (j != i) pairs.emplace_back(exact_sqdist(xi, X + j * D, D), j);
        sort_pairs(pairs, k);
      }
      for (int64_t c = 0; c < k; ++c) {
        out_idx[i * k + c] = pairs[size_t(c)].second;
        out_d2[i * k + c] = pairs[size_t(c)].first;
      }
    }
  }
}

template void knn<float>(const float*, int64_t, int64_t, int64_t, int64_t*, double*, bool);
template void knn<double>(const double*, int64_t, int64_t, int64_t, int64_t*, double*, bool);

}  // namespace dihal
