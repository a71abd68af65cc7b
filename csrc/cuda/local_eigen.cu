// Local curvature on the GPU: one block per point gathers the point and its k neighbours, builds
// their centred (k+1) x (k+1) float64 Gram matrix in shared memory column chunk by column chunk
// (never a D x D matrix), and the whole block takes its top eigenvalue by parallel Jacobi rotations.
#include <algorithm>
#include <string>

#include "common.cuh"
#include "jacobi.hpp"
#include "nvtx.hpp"
#include "ops.hpp"

namespace dihal::cuda {
namespace {

constexpr int kThreads = 128;
constexpr size_t kSharedLimit = 48 * 1024;  // default dynamic shared memory per block

// Shared bytes for m points and column chunks of `chunk`: Gram, padded chunk (reused for the
// rotations of the eigen step), pair codes.
size_t shared_bytes(int m, int chunk) {
  const int pairs = m * (m + 1) / 2;
  return sizeof(double) * (size_t(m) * m + size_t(m) * (chunk + 1)) + sizeof(uint16_t) * pairs;
}

// The Team of jacobi_top_eigenvalue_team: the threads of the block.
struct BlockTeam {
  template <typename F>
  __device__ void for_each(int count, F&& f) const {
    for (int e = threadIdx.x; e < count; e += blockDim.x) f(e);
    __syncthreads();
  }
  template <typename F>
  __device__ void single(F&& f) const {
    if (threadIdx.x == 0) f();
    __syncthreads();
  }
};

int chunk_for(int m) {
  int chunk = 32;
  while (chunk > 1 && shared_bytes(m, chunk) > kSharedLimit) chunk /= 2;
  return chunk;
}

template <typename T>
__global__ void local_eigen_kernel(const T* X, int64_t D, const int64_t* idx, int k, int chunk, double* out) {
  extern __shared__ double shared[];
  __shared__ int64_t rows[kMaxLocalPoints];
  __shared__ int stop;
  const int m = k + 1, stride = chunk + 1, pairs = m * (m + 1) / 2;
  double* G = shared;
  double* tile = G + m * m;
  uint16_t* pair_code = reinterpret_cast<uint16_t*>(tile + m * stride);
  const int64_t i = blockIdx.x;
  for (int a = threadIdx.x; a < m; a += blockDim.x) rows[a] = a == 0 ? i : idx[i * k + (a - 1)];
  for (int p = threadIdx.x; p < m * m; p += blockDim.x) G[p] = 0.0;
  if (threadIdx.x == 0) {
    int p = 0;
    for (int a = 0; a < m; ++a)
      for (int b = a; b < m; ++b) pair_code[p++] = uint16_t((a << 8) | b);
  }
  __syncthreads();
  for (int64_t c0 = 0; c0 < D; c0 += chunk) {
    const int width = int(D - c0 < chunk ? D - c0 : chunk);
    for (int e = threadIdx.x; e < m * chunk; e += blockDim.x) {
      const int a = e / chunk, cc = e % chunk;
      if (cc < width) tile[a * stride + cc] = to_double(X[rows[a] * D + c0 + cc]);
    }
    __syncthreads();
    for (int cc = threadIdx.x; cc < width; cc += blockDim.x) {  // centre each column at its mean
      double mean = 0.0;
      for (int a = 0; a < m; ++a) mean += tile[a * stride + cc];
      mean /= double(m);
      for (int a = 0; a < m; ++a) tile[a * stride + cc] -= mean;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {  // each pair has one owner thread
      const int a = pair_code[p] >> 8, b = pair_code[p] & 0xff;
      double s = 0.0;
      for (int cc = 0; cc < width; ++cc) s += tile[a * stride + cc] * tile[b * stride + cc];
      G[a * m + b] += s;
    }
    __syncthreads();
  }
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int a = pair_code[p] >> 8, b = pair_code[p] & 0xff;
    G[b * m + a] = G[a * m + b];
  }
  __syncthreads();
  // The rotations' (c, s) pairs reuse the chunk tile: m * (chunk + 1) >= m + 1 >= 2 * (M / 2) doubles.
  const double top = jacobi_top_eigenvalue_team(G, m, tile, &stop, BlockTeam{});
  if (threadIdx.x == 0) out[i] = top / double(m);
}

}  // namespace

void local_top_eigenvalues(const void* X, DType dtype, int64_t n, int64_t D, const int64_t* idx, int64_t k,
                           double* out, int device, cudaStream_t stream) {
  DIHAL_NVTX_RANGE("dihal/local_eigen");
  if (n < 1 || D < 1) throw std::invalid_argument("local_top_eigenvalues: X must be non-empty");
  if (k < 1 || k + 1 > kMaxLocalPoints)
    throw std::invalid_argument("local_top_eigenvalues: k must satisfy 1 <= k < " + std::to_string(kMaxLocalPoints) +
                                ", got " + std::to_string(k));
  const DeviceGuard guard(device);
  const int m = int(k + 1), chunk = chunk_for(m);
  dispatch_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    local_eigen_kernel<T><<<unsigned(n), kThreads, shared_bytes(m, chunk), stream>>>(static_cast<const T*>(X), D, idx,
                                                                                    int(k), chunk, out);
    check_launch("local_eigen_kernel");
  });
}

}  // namespace dihal::cuda
