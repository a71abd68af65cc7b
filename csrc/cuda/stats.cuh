// Column means and maxima in float64, deterministic (fixed reduction order, no atomics).
#pragma once
#include <algorithm>
#include <cmath>

#include "common.cuh"

namespace dihal::cuda {

// Row splits of the column-mean reduction (partial sums per split, then summed in order).
constexpr int kMeanSplits = 32;

template <typename T>
__global__ void column_partial_sums_kernel(const T* X, int64_t rows, int64_t D, double* partial) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= D) return;
  double s = 0.0;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) s += to_double(X[r * D + c]);
  partial[int64_t(blockIdx.y) * D + c] = s;
}

__global__ inline void finish_mean_kernel(const double* partial, int splits, int64_t D, int64_t rows, double* mean) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= D) return;
  double s = 0.0;
  for (int y = 0; y < splits; ++y) s += partial[int64_t(y) * D + c];
  mean[c] = s / double(rows);
}

// mean[c] = sum_r X[r, c] / rows in float64; `partial` holds kMeanSplits * D doubles.
template <typename T>
void column_mean(const T* X, int64_t rows, int64_t D, double* partial, double* mean, cudaStream_t stream) {
  const int threads = 256;
  const int splits = int(rows < kMeanSplits ? rows : kMeanSplits);
  const dim3 grid(unsigned(ceil_div(D, threads)), unsigned(splits));
  column_partial_sums_kernel<T><<<grid, threads, 0, stream>>>(X, rows, D, partial);
  check_launch("column_partial_sums_kernel");
  finish_mean_kernel<<<unsigned(ceil_div(D, threads)), threads, 0, stream>>>(partial, splits, D, rows, mean);
  check_launch("finish_mean_kernel");
}

// out[0] = max(values[0..count)) (0 for count == 0), one block of 1024 threads.
__global__ inline void max_kernel(const double* values, int64_t count, double* out) {
  __shared__ double scratch[32];
  double m = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) m = fmax(m, values[i]);
  for (int offset = 16; offset > 0; offset >>= 1) m = fmax(m, __shfl_down_sync(kFullMask, m, offset));
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < (blockDim.x >> 5) ? scratch[threadIdx.x] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1) m = fmax(m, __shfl_down_sync(kFullMask, m, offset));
    if (threadIdx.x == 0) out[0] = m;
  }
}

inline void device_max(const double* values, int64_t count, double* out, cudaStream_t stream) {
  max_kernel<<<1, 1024, 0, stream>>>(values, count, out);
  check_launch("max_kernel");
}

// row_max[r] = max_c |X[r, c] - mean[c]| in float64, one warp per row.
template <typename T>
__global__ void row_max_abs_kernel(const T* X, int64_t n, int64_t D, const double* mean, double* row_max) {
  for (int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; row < n;
       row += int64_t(gridDim.x) * (blockDim.x >> 5)) {
    double m = 0.0;
    for (int64_t c = threadIdx.x & 31; c < D; c += 32) m = fmax(m, fabs(to_double(X[row * D + c]) - mean[c]));
    for (int offset = 16; offset > 0; offset >>= 1) m = fmax(m, __shfl_down_sync(kFullMask, m, offset));
    if ((threadIdx.x & 31) == 0) row_max[row] = m;
  }
}

// out[0] = max |X[r, c] - mean[c]| over the rows x D block (row_max holds `rows` doubles).
template <typename T>
void max_abs_deviation(const T* X, int64_t rows, int64_t D, const double* mean, double* row_max, double* out,
                       cudaStream_t stream) {
  const int threads = 256;
  row_max_abs_kernel<T><<<unsigned(std::min<int64_t>(ceil_div(rows * 32, threads), int64_t(1) << 20)), threads, 0,
                          stream>>>(X, rows, D, mean, row_max);
  check_launch("row_max_abs_kernel");
  device_max(row_max, rows, out, stream);
}

}  // namespace dihal::cuda
