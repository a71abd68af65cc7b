// Streaming covariance on the GPU: blocks of rows centred at their own float64 mean, co-moment of
// the block by cuBLAS (float16 / bfloat16 / float32 rows: centred values rounded once to float32, float32
// products and sums in PEDANTIC mode, as the CPU does; float64 rows or exact=true: a float64 SYRK), and
// Chan's pairwise merge of (count, mean, co-moment) in float64 - the CPU algorithm of
// csrc/cpu/covariance.cpp with the block products on the GPU. A non-float64 block whose centred
// values reach 2^15 is scaled by a power of two first (exact; the rule is csrc/covariance_scale.hpp),
// so that the float32 sums never overflow; the merge undoes the scale in float64.
#include <algorithm>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "covariance_scale.hpp"
#include "cublas.hpp"
#include "nvtx.hpp"
#include "ops.hpp"
#include "stats.cuh"

namespace dihal::cuda {
namespace {

// Column blocks of the upper-triangular product (62.5 % of a full GEMM's work at D = 4096).
constexpr int64_t kGramBlockColumns = 1024;

template <typename C>
struct GramOf {
  using type = float;  // float32 accumulation of the float32 centred values
};
template <>
struct GramOf<double> {
  using type = double;
};

template <typename C>
cudaDataType data_type();
template <>
cudaDataType data_type<float>() { return CUDA_R_32F; }

// Rows per block: about 128 MiB of centred rows, between 1024 and 16384 rows (the float32
// accumulation error of a block grows with its rows), at most n.
int64_t block_rows(int64_t n, int64_t D, size_t elem) {
  const int64_t target = (int64_t(128) << 20) / std::max<int64_t>(1, D * int64_t(elem));
  return std::min(n, std::clamp<int64_t>(target, 1024, 16384));
}

template <typename C>
struct Buffers {
  double* partial;
  double* block_mean;
  double* delta;
  double* row_max;
  double* scalars;  // max |x - block mean|, the block's scale, 1 / scale^2
  C* centred;
  typename GramOf<C>::type* gram;
};

template <typename C>
Buffers<C> carve(Workspace& ws, int64_t n, int64_t D) {
  const int64_t rows = block_rows(n, D, sizeof(C));
  Buffers<C> b;
  b.partial = ws.take<double>(kMeanSplits * D);
  b.block_mean = ws.take<double>(D);
  b.delta = ws.take<double>(D);
  b.row_max = ws.take<double>(rows);
  b.scalars = ws.take<double>(3);
  b.centred = ws.take<C>(rows * D);
  b.gram = ws.take<typename GramOf<C>::type>(D * D);
  return b;
}

unsigned grid_for(int64_t total, int threads) {
  return unsigned(std::min<int64_t>(ceil_div(total, threads), int64_t(1) << 20));
}

__global__ void delta_kernel(const double* block_mean, const double* mean, int64_t D, double* delta) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < D) delta[c] = block_mean[c] - mean[c];
}

// scalars[1] = covariance_block_scale(max |x - mean|) (csrc/covariance_scale.hpp), scalars[2] = 1 / scalars[1]^2.
__global__ void block_scale_kernel(double* scalars) {
  const double scale = covariance_block_scale(scalars[0]);
  scalars[1] = scale;
  scalars[2] = 1.0 / (scale * scale);
}

// out = (X - mean) * scale in C; scalars is null (scale 1) for float64 blocks.
template <typename T, typename C>
__global__ void centre_kernel(const T* X, int64_t rows, int64_t D, const double* mean, const double* scalars, C* out) {
  const double scale = scalars ? scalars[1] : 1.0;
  const int64_t total = rows * D;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x)
    out[e] = from_double<C>((to_double(X[e]) - mean[e % D]) * scale);
}

// M[a, b] += G[a, b] / scale^2 + w delta_a delta_b on the upper triangle (b >= a), all row-major.
template <typename G>
__global__ void merge_kernel(double* M, const G* gram, const double* scalars, const double* delta, double w, int64_t D) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t a = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  if (a >= D || b >= D || b < a) return;
  const double unscale = scalars ? scalars[2] : 1.0;
  M[a * D + b] += double(gram[a * D + b]) * unscale + (delta[a] * w) * delta[b];
}

__global__ void mean_update_kernel(double* mean, const double* delta, double fraction, int64_t D) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < D) mean[c] += delta[c] * fraction;
}

// Upper triangle (row-major) of centred^T centred for a rows x D row-major block, which is the
// lower triangle of the column-major D x D product: one GEMM per block of columns.
template <typename C>
void block_gram(cublas::Handle h, const C* centred, int64_t rows, int64_t D, float* gram) {
  const float one = 1.0f, zero = 0.0f;
  for (int64_t j0 = 0; j0 < D; j0 += kGramBlockColumns) {
    const int64_t jb = std::min(kGramBlockColumns, D - j0);
    cublas::check(cublas::api().gemm_ex(h, cublas::kOpN, cublas::kOpT, int(D - j0), int(jb), int(rows), &one,
                                        centred + j0, data_type<C>(), int(D), centred + j0, data_type<C>(), int(D),
                                        &zero, gram + j0 + j0 * D, CUDA_R_32F, int(D), cublas::kCompute32FPedantic,
                                        cublas::kGemmDefault),
                  "cublasGemmEx (covariance block)");
  }
}

void block_gram(cublas::Handle h, const double* centred, int64_t rows, int64_t D, double* gram) {
  const double one = 1.0, zero = 0.0;
  cublas::check(cublas::api().dsyrk(h, cublas::kFillLower, cublas::kOpN, int(D), int(rows), &one, centred, int(D),
                                    &zero, gram, int(D)),
                "cublasDsyrk (covariance block)");
}

template <typename T, typename C>
int64_t update(const T* X, int64_t n, int64_t D, int64_t count, double* mean, double* M, Workspace& ws, int device,
               cudaStream_t stream) {
  const Buffers<C> b = carve<C>(ws, n, D);
  const int64_t block = block_rows(n, D, sizeof(C));
  const cublas::Handle h = cublas::handle(device, stream);
  const int threads = 256;
  const unsigned vec_grid = unsigned(ceil_div(D, threads));
  const dim3 merge_block(32, 8), merge_grid(unsigned(ceil_div(D, 32)), unsigned(ceil_div(D, 8)));
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t rows = std::min(block, n - r0);
    const T* Xb = X + r0 * D;
    column_mean(Xb, rows, D, b.partial, b.block_mean, stream);
    delta_kernel<<<vec_grid, threads, 0, stream>>>(b.block_mean, mean, D, b.delta);
    check_launch("delta_kernel");
    const double* scalars = nullptr;
    if constexpr (!std::is_same_v<C, double>) {
      max_abs_deviation(Xb, rows, D, b.block_mean, b.row_max, b.scalars, stream);
      block_scale_kernel<<<1, 1, 0, stream>>>(b.scalars);
      check_launch("block_scale_kernel");
      scalars = b.scalars;
    }
    centre_kernel<T, C><<<grid_for(rows * D, threads), threads, 0, stream>>>(Xb, rows, D, b.block_mean, scalars,
                                                                            b.centred);
    check_launch("centre_kernel");
    block_gram(h, b.centred, rows, D, b.gram);
    const double na = double(count), nb = double(rows), total = na + nb;
    merge_kernel<<<merge_grid, merge_block, 0, stream>>>(M, b.gram, scalars, b.delta, na * nb / total, D);
    check_launch("merge_kernel");
    mean_update_kernel<<<vec_grid, threads, 0, stream>>>(mean, b.delta, nb / total, D);
    check_launch("mean_update_kernel");
    count += rows;
  }
  return count;
}

void check_dimensions(int64_t n, int64_t D) {
  if (n < 1 || D < 1) throw std::invalid_argument("X must have at least one row and one column");
  if (D > (int64_t(1) << 16))
    throw std::invalid_argument("the CUDA covariance supports D <= 65536 (a D x D float64 matrix), got D = " +
                                std::to_string(D));
}

}  // namespace

size_t covariance_workspace(int64_t n, int64_t D, DType dtype, bool exact) {
  check_dimensions(n, D);
  Workspace ws(nullptr, 0);
  if (exact || dtype == DType::kFloat64) {
    carve<double>(ws, n, D);
  } else {
    dispatch_dtype(dtype, [&](auto t) {
      using T = decltype(t);
      if constexpr (!std::is_same_v<T, double>) carve<float>(ws, n, D);
    });
  }
  return ws.used();
}

int64_t covariance_update(const void* X, DType dtype, int64_t n, int64_t D, int64_t count, double* mean,
                          double* comoment, bool exact, void* workspace, size_t workspace_bytes, int device,
                          cudaStream_t stream) {
  DIHAL_NVTX_RANGE("dihal/covariance");
  check_dimensions(n, D);
  const DeviceGuard guard(device);
  Workspace ws(workspace, workspace_bytes);
  int64_t result = count;
  dispatch_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const T* x = static_cast<const T*>(X);
    if constexpr (std::is_same_v<T, double>) {
      result = update<T, double>(x, n, D, count, mean, comoment, ws, device, stream);
    } else {
      result = exact ? update<T, double>(x, n, D, count, mean, comoment, ws, device, stream)
                     : update<T, float>(x, n, D, count, mean, comoment, ws, device, stream);
    }
  });
  return result;
}

}  // namespace dihal::cuda
