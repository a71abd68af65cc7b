// Exact kNN on the GPU: tiles of dot products of the centred, power-of-two-scaled rows from cuBLAS
// (or candidates from cuVS brute force), a fused distance + bounded-candidate-list kernel per
// (query, split of the reference columns), a merge of the splits, and an exact float64 re-rank with
// certification. The logic shared with the CPU kernel (csrc/cpu/knn.cpp) is in csrc/knn_logic.hpp.
#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "cublas.hpp"
#include "knn_logic.hpp"
#include "nvtx.hpp"
#include "ops.hpp"
#include "stats.cuh"
#ifndef DIHAL_HAVE_CUVS
#define DIHAL_HAVE_CUVS 0
#endif
#if DIHAL_HAVE_CUVS
#include "cuvs_knn.hpp"
#endif

namespace dihal::cuda {
namespace {

namespace kl = dihal::knn_logic;

constexpr int kThreads = 256;
using kl::Plan;

Plan make_plan(int64_t n, int64_t k, int64_t list_entry_bytes) { return kl::make_plan(n, k, list_entry_bytes, kl::kTiling); }

// Workspace of one call. The centred, scaled rows are made per tile (query block and reference
// block, qrows / rrows) rather than as a full n x D copy: that copy would be as large as X in W
// (128 GB of float64 at n = 1e6, D = 8192). cuVS indexes the whole dataset, so its path alone keeps
// all rows centred in float32 (`centred`).
template <typename W>
struct Buffers {
  double *mean, *partial, *row_max, *scalars;  // scalars: max |x - mean|, scale, max ||x_c||^2
  W* centred;
  W* qrows;
  W* rrows;
  W* norms;
  double* norms64;
  W* tile;
  W* list_d;
  int32_t* list_i;
  W* merged_d;
  int32_t* merged_i;
  int64_t* cuvs_idx;
  float* cuvs_dist;
};

template <typename W>
Buffers<W> carve(Workspace& ws, int64_t n, int64_t D, const Plan& p, bool use_cuvs) {
  Buffers<W> b{};
  b.mean = ws.take<double>(D);
  b.partial = ws.take<double>(kMeanSplits * D);
  b.row_max = ws.take<double>(n);
  b.scalars = ws.take<double>(3);
  b.norms = ws.take<W>(n);
  b.norms64 = ws.take<double>(n);
  if (use_cuvs) {
    b.centred = ws.take<W>(n * D);
    b.cuvs_idx = ws.take<int64_t>(p.query_block * (p.cap + 1));
    b.cuvs_dist = ws.take<float>(p.query_block * (p.cap + 1));
  } else {
    b.qrows = ws.take<W>(p.query_block * D);
    b.rrows = ws.take<W>(p.ref_block * D);
    b.tile = ws.take<W>(p.query_block * p.ref_block);
    b.list_d = ws.take<W>(p.query_block * p.splits * p.cap);
    b.list_i = ws.take<int32_t>(p.query_block * p.splits * p.cap);
  }
  b.merged_d = ws.take<W>(p.query_block * p.cap);
  b.merged_i = ws.take<int32_t>(p.query_block * p.cap);
  return b;
}

unsigned blocks_for(int64_t threads_total) {
  return unsigned(std::min<int64_t>(ceil_div(threads_total, kThreads), int64_t(1) << 20));
}

// ||a - b||^2 in float64 over a warp (valid in lane 0).
template <typename T>
__device__ double warp_sqdist(const T* a, const T* b, int64_t D) {
  double s = 0.0;
  for (int64_t c = threadIdx.x & 31; c < D; c += 32) {
    const double d = to_double(a[c]) - to_double(b[c]);
    s += d * d;
  }
  return warp_sum(s);
}

// Rows handled by the warps of the grid in turn (row is uniform across a warp).
#define DIHAL_FOR_EACH_WARP_ROW(row, n)                                                   \
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; row < (n); \
       row += int64_t(gridDim.x) * (blockDim.x >> 5))

__global__ void scale_kernel(double* scalars) { scalars[1] = kl::pow2_scale(scalars[0]); }

// The centred, scaled rows rows0 .. rows0 + rows - 1 of X in W (one tile's operand).
template <typename T, typename W>
__global__ void centre_scale_kernel(const T* X, int64_t row0, int64_t rows, int64_t D, const double* mean,
                                    const double* scalars, W* out) {
  const double scale = scalars[1];
  const int64_t total = rows * D;
  const T* src = X + row0 * D;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x)
    out[e] = W((to_double(src[e]) - mean[e % D]) * scale);
}

// Squared norms of the centred, scaled rows (the values centre_scale_kernel writes), from X.
template <typename T, typename W>
__global__ void row_norms_kernel(const T* X, int64_t n, int64_t D, const double* mean, const double* scalars, W* norms,
                                 double* norms64) {
  const double scale = scalars[1];
  DIHAL_FOR_EACH_WARP_ROW(row, n) {
    double s = 0.0;
    for (int64_t c = threadIdx.x & 31; c < D; c += 32) {
      const double v = double(W((to_double(X[row * D + c]) - mean[c]) * scale));
      s += v * v;
    }
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) {
      norms[row] = W(s);
      norms64[row] = s;
    }
  }
}

template <typename W>
__global__ void clear_lists_kernel(W* dist, int32_t* idx, int64_t count) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x) {
    dist[e] = kl::infinity<W>();
    idx[e] = -1;
  }
}

// Thread (q, s) scans split s of the tile's reference columns for query q0 + q.
template <typename W>
__global__ void scan_kernel(const W* tile, int64_t nq, int64_t nr, int64_t splits, int64_t cap, const W* norms,
                            int64_t q0, int64_t r0, W* list_d, int32_t* list_i) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= nq * splits) return;
  const int64_t q = t % nq, s = t / nq;
  const int64_t slot = (q * splits + s) * cap;
  const kl::CandidateList<W, int32_t> list{list_d + slot, list_i + slot, int(cap)};
  kl::scan_tile(tile + q, nq, norms[q0 + q], norms + r0, r0, nr * s / splits, nr * (s + 1) / splits, q0 + q, list);
}

template <typename W>
__global__ void merge_kernel(const W* list_d, const int32_t* list_i, int64_t nq, int64_t splits, int64_t cap,
                             W* merged_d, int32_t* merged_i) {
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= nq) return;
  const kl::CandidateList<W, int32_t> out{merged_d + q * cap, merged_i + q * cap, int(cap)};
  kl::merge_lists(list_d + q * splits * cap, list_i + q * splits * cap, int(splits), int(cap), out);
}

// One block per query: exact float64 distances of its candidates (one warp per candidate), then
// each thread ranks candidates, writes the k best and, for rank k - 1, the certification flag.
template <typename T, typename W>
__global__ void rerank_kernel(const T* X, int64_t n, int64_t D, int64_t k, int64_t cap, int64_t q0, const W* merged_d,
                              const int32_t* merged_i, const W* norms, const double* scalars, kl::ErrorModel model,
                              int64_t* out_idx, double* out_d2, int32_t* flags) {
  extern __shared__ double shared[];
  double* exact = shared;
  int32_t* cand = reinterpret_cast<int32_t*>(exact + cap);
  const int64_t q = blockIdx.x, i = q0 + q;
  for (int64_t e = threadIdx.x; e < cap; e += blockDim.x) cand[e] = merged_i[q * cap + e];
  if (threadIdx.x == 0) flags[i] = 1;  // until the rank k - 1 thread certifies the row
  __syncthreads();
  const int warps = blockDim.x >> 5;
  for (int64_t e = threadIdx.x >> 5; e < cap; e += warps) {
    const int32_t j = cand[e];
    const double s = j >= 0 ? warp_sqdist(X + i * D, X + int64_t(j) * D, D) : INFINITY;
    if ((threadIdx.x & 31) == 0) exact[e] = s;
  }
  __syncthreads();
  const double scale = scalars[1], max_norm2 = scalars[2];
  const double threshold = double(merged_d[q * cap + cap - 1]);
  for (int64_t e = threadIdx.x; e < cap; e += blockDim.x) {
    const int r = kl::rank_of(exact, cand, int(cap), int(e));
    if (r < k) {
      out_idx[i * k + r] = cand[e];
      out_d2[i * k + r] = exact[e];
    }
    if (r == k - 1) {
      const double limit = kl::certify_limit(model, exact[e] * scale * scale, double(norms[i]), max_norm2);
      flags[i] = kl::certified(cap == n - 1, threshold, limit) ? 0 : 1;
    }
  }
}

template <typename T>
__global__ void exact_rows_kernel(const T* X, int64_t n, int64_t D, const int64_t* rows, int64_t n_rows, double* out) {
  const int64_t stride = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; w < n_rows * n; w += stride) {
    const double s = warp_sqdist(X + rows[w / n] * D, X + (w % n) * D, D);
    if ((threadIdx.x & 31) == 0) out[w] = s;
  }
}

// tile[j * nq + q] = <xq_q, xr_j> (column-major nq x nr).
void tile_gemm(cublas::Handle h, const float* Xq, int64_t nq, const float* Xr, int64_t nr, int64_t D, float* tile) {
  const float one = 1.0f, zero = 0.0f;
  cublas::check(cublas::api().gemm_ex(h, cublas::kOpT, cublas::kOpN, int(nq), int(nr), int(D), &one, Xq, CUDA_R_32F,
                                      int(D), Xr, CUDA_R_32F, int(D), &zero, tile, CUDA_R_32F, int(nq),
                                      cublas::kCompute32FPedantic, cublas::kGemmDefault),
                "cublasGemmEx (kNN tile)");
}

void tile_gemm(cublas::Handle h, const double* Xq, int64_t nq, const double* Xr, int64_t nr, int64_t D, double* tile) {
  const double one = 1.0, zero = 0.0;
  cublas::check(cublas::api().gemm_ex(h, cublas::kOpT, cublas::kOpN, int(nq), int(nr), int(D), &one, Xq, CUDA_R_64F,
                                      int(D), Xr, CUDA_R_64F, int(D), &zero, tile, CUDA_R_64F, int(nq),
                                      cublas::kCompute64FPedantic, cublas::kGemmDefault),
                "cublasGemmEx (kNN float64 tile)");
}

template <typename T, typename W>
void centre_rows(const T* X, int64_t row0, int64_t rows, int64_t D, const Buffers<W>& b, W* out, cudaStream_t stream) {
  centre_scale_kernel<T, W><<<blocks_for(rows * D), kThreads, 0, stream>>>(X, row0, rows, D, b.mean, b.scalars, out);
  check_launch("centre_scale_kernel");
}

// Mean, power-of-two scale, the squared norms of the centred rows in W and the largest one (and,
// for cuVS, all centred rows).
template <typename T, typename W>
void prepare(const T* X, int64_t n, int64_t D, const Buffers<W>& b, cudaStream_t stream) {
  column_mean(X, n, D, b.partial, b.mean, stream);
  max_abs_deviation(X, n, D, b.mean, b.row_max, b.scalars + 0, stream);
  scale_kernel<<<1, 1, 0, stream>>>(b.scalars);
  check_launch("scale_kernel");
  if (b.centred) centre_rows(X, 0, n, D, b, b.centred, stream);
  row_norms_kernel<T, W><<<blocks_for(n * 32), kThreads, 0, stream>>>(X, n, D, b.mean, b.scalars, b.norms, b.norms64);
  check_launch("row_norms_kernel");
  device_max(b.norms64, n, b.scalars + 2, stream);
}

// Candidate lists of queries [q0, q0 + nq) from the own tiled kernel, merged into b.merged_*.
template <typename T, typename W>
void tiled_candidates(const T* X, const Buffers<W>& b, const Plan& p, int64_t n, int64_t D, int64_t q0, int64_t nq,
                      cublas::Handle h, cudaStream_t stream) {
  const int64_t lists = nq * p.splits * p.cap;
  clear_lists_kernel<W><<<blocks_for(lists), kThreads, 0, stream>>>(b.list_d, b.list_i, lists);
  check_launch("clear_lists_kernel");
  centre_rows(X, q0, nq, D, b, b.qrows, stream);
  for (int64_t r0 = 0; r0 < n; r0 += p.ref_block) {
    const int64_t nr = std::min(p.ref_block, n - r0);
    const bool same = r0 == q0 && nr == nq;  // the diagonal tile reads the query rows twice
    if (!same) centre_rows(X, r0, nr, D, b, b.rrows, stream);
    tile_gemm(h, b.qrows, nq, same ? b.qrows : b.rrows, nr, D, b.tile);
    scan_kernel<W><<<blocks_for(nq * p.splits), kThreads, 0, stream>>>(b.tile, nq, nr, p.splits, p.cap, b.norms, q0,
                                                                       r0, b.list_d, b.list_i);
    check_launch("scan_kernel");
  }
  merge_kernel<W><<<blocks_for(nq), kThreads, 0, stream>>>(b.list_d, b.list_i, nq, p.splits, p.cap, b.merged_d,
                                                           b.merged_i);
  check_launch("merge_kernel");
}

template <typename T, typename W>
void run_knn(const T* X, int64_t n, int64_t D, int64_t k, int64_t* idx, double* d2, int32_t* flags, bool use_cuvs,
             Workspace& ws, int device, cudaStream_t stream) {
  const Plan p = make_plan(n, k, int64_t(sizeof(W) + sizeof(int32_t)));
  const Buffers<W> b = carve<W>(ws, n, D, p, use_cuvs);
  prepare<T, W>(X, n, D, b, stream);
  // The error model of the path that makes the candidates (csrc/knn_logic.hpp): the own GEMM in W,
  // or cuVS's float32 kernels.
  const kl::ErrorModel model = use_cuvs ? kl::cuvs_model(D) : kl::gemm_model(D, std::is_same_v<W, double>);
  const size_t rerank_shared = size_t(p.cap) * (sizeof(double) + sizeof(int32_t));
#if DIHAL_HAVE_CUVS
  std::unique_ptr<CuvsBruteForce> cuvs;
  if constexpr (std::is_same_v<W, float>)
    if (use_cuvs) cuvs = std::make_unique<CuvsBruteForce>(b.centred, n, D, device, stream);
#endif
  const cublas::Handle h = use_cuvs ? nullptr : cublas::handle(device, stream);
  for (int64_t q0 = 0; q0 < n; q0 += p.query_block) {
    const int64_t nq = std::min(p.query_block, n - q0);
    if (!use_cuvs) {
      tiled_candidates(X, b, p, n, D, q0, nq, h, stream);
    } else {
#if DIHAL_HAVE_CUVS
      if constexpr (std::is_same_v<W, float>)
        cuvs->candidates(q0, nq, p.cap, b.cuvs_idx, b.cuvs_dist, b.merged_d, b.merged_i, stream);
#endif
    }
    rerank_kernel<T, W><<<unsigned(nq), 128, rerank_shared, stream>>>(X, n, D, k, p.cap, q0, b.merged_d, b.merged_i,
                                                                      b.norms, b.scalars, model, idx, d2, flags);
    check_launch("rerank_kernel");
  }
}

void check_knn_arguments(int64_t n, int64_t D, int64_t k, bool use_cuvs) {
  if (n < 2 || D < 1) throw std::invalid_argument("kNN needs at least 2 rows and 1 column");
  if (n >= int64_t(std::numeric_limits<int32_t>::max())) throw std::invalid_argument("kNN supports n < 2^31 rows");
  if (k < 1 || k >= n) throw std::invalid_argument("k must satisfy 1 <= k < n");
  if (kl::capacity(n, k) > kMaxKnnCandidates)
    throw std::invalid_argument("k = " + std::to_string(k) + " needs more than " + std::to_string(kMaxKnnCandidates) +
                                " candidates; use exact_sqdist_rows");
  if (use_cuvs && !cuvs_compiled()) throw std::invalid_argument("this build has no cuVS");
}

// Calls fn(T{}, W{}) with the input type T and working type W (float, or double for float64
// input unless cuVS, which works in float32, provides the candidates).
template <typename Fn>
void dispatch_knn(DType dtype, bool use_cuvs, Fn&& fn) {
  dispatch_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, double>) {
      if (!use_cuvs)
        fn(t, double{});
      else
        fn(t, float{});
    } else {
      fn(t, float{});
    }
  });
}

}  // namespace

size_t knn_workspace(int64_t n, int64_t D, int64_t k, DType dtype, bool use_cuvs) {
  check_knn_arguments(n, D, k, use_cuvs);
  Workspace ws(nullptr, 0);
  dispatch_knn(dtype, use_cuvs, [&](auto, auto w) {
    using W = decltype(w);
    carve<W>(ws, n, D, make_plan(n, k, int64_t(sizeof(W) + sizeof(int32_t))), use_cuvs);
  });
  return ws.used();
}

void knn_candidates(const void* X, DType dtype, int64_t n, int64_t D, int64_t k, int64_t* idx, double* d2,
                    int32_t* flags, bool use_cuvs, void* workspace, size_t workspace_bytes, int device,
                    cudaStream_t stream) {
  DIHAL_NVTX_RANGE("dihal/knn");
  check_knn_arguments(n, D, k, use_cuvs);
  const DeviceGuard guard(device);
  Workspace ws(workspace, workspace_bytes);
  dispatch_knn(dtype, use_cuvs, [&](auto t, auto w) {
    using T = decltype(t);
    using W = decltype(w);
    run_knn<T, W>(static_cast<const T*>(X), n, D, k, idx, d2, flags, use_cuvs, ws, device, stream);
  });
}

void exact_sqdist_rows(const void* X, DType dtype, int64_t n, int64_t D, const int64_t* rows, int64_t n_rows,
                       double* out, int device, cudaStream_t stream) {
  DIHAL_NVTX_RANGE("dihal/knn");
  if (n < 1 || D < 1 || n_rows < 0) throw std::invalid_argument("exact_sqdist_rows: bad sizes");
  if (n_rows == 0) return;
  const DeviceGuard guard(device);
  dispatch_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    exact_rows_kernel<T><<<blocks_for(n_rows * n * 32), kThreads, 0, stream>>>(static_cast<const T*>(X), n, D, rows,
                                                                                n_rows, out);
    check_launch("exact_rows_kernel");
  });
}

bool cuvs_compiled() { return DIHAL_HAVE_CUVS; }

}  // namespace dihal::cuda
