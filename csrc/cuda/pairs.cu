// Monotonicity on the GPU: for chunks of pairs, the float64 differences d = x_i - x_j and ||d||^2,
// one triangular solve L y = d for the whole chunk (cuBLAS DTRSM with the Cholesky factor of the
// regularised covariance), then ||y||^2 / ||d||^2 = d^T (Sigma + lam I)^-1 d / ||d||^2.
#include <algorithm>
#include <cmath>

#include "common.cuh"
#include "cublas.hpp"
#include "nvtx.hpp"
#include "ops.hpp"

namespace dihal::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkBytes = int64_t(256) << 20;

int64_t pair_chunk(int64_t D, int64_t n_pairs) {
  return std::max<int64_t>(1, std::min(n_pairs, kChunkBytes / (D * int64_t(sizeof(double)))));
}

struct Buffers {
  double* diff;  // chunk x D, row-major (= D x chunk column-major for the solve)
  double* den;   // chunk
};

Buffers carve(Workspace& ws, int64_t D, int64_t n_pairs) {
  const int64_t chunk = pair_chunk(D, n_pairs);
  Buffers b;
  b.diff = ws.take<double>(chunk * D);
  b.den = ws.take<double>(chunk);
  return b;
}

template <typename T>
__global__ void differences_kernel(const T* X, int64_t D, const int64_t* pi, const int64_t* pj, int64_t p0,
                                   double* diff, double* den) {
  __shared__ double scratch[32];
  const int64_t p = blockIdx.x;
  const T* a = X + pi[p0 + p] * D;
  const T* b = X + pj[p0 + p] * D;
  double s = 0.0;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    const double d = to_double(a[c]) - to_double(b[c]);
    diff[p * D + c] = d;
    s += d * d;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) den[p] = s;
}

__global__ void quotient_kernel(const double* y, int64_t D, const double* den, int64_t p0, double* out) {
  __shared__ double scratch[32];
  const int64_t p = blockIdx.x;
  double s = 0.0;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) s += y[p * D + c] * y[p * D + c];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) out[p0 + p] = den[p] > 0.0 ? s / den[p] : NAN;
}

}  // namespace

size_t pair_workspace(int64_t D, int64_t n_pairs) {
  if (D < 1 || n_pairs < 1) throw std::invalid_argument("pair_workspace: D and n_pairs must be positive");
  Workspace ws(nullptr, 0);
  carve(ws, D, n_pairs);
  return ws.used();
}

void pair_quotients(const void* X, DType dtype, int64_t n, int64_t D, const double* chol_lower, const int64_t* pi,
                    const int64_t* pj, int64_t n_pairs, double* out, void* workspace, size_t workspace_bytes,
                    int device, cudaStream_t stream) {
  DIHAL_NVTX_RANGE("dihal/pairs");
  if (n < 2 || D < 1 || n_pairs < 1) throw std::invalid_argument("pair_quotients: bad sizes");
  const DeviceGuard guard(device);
  Workspace ws(workspace, workspace_bytes);
  const Buffers b = carve(ws, D, n_pairs);
  const int64_t chunk = pair_chunk(D, n_pairs);
  const cublas::Handle h = cublas::handle(device, stream);
  const double one = 1.0;
  dispatch_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    for (int64_t p0 = 0; p0 < n_pairs; p0 += chunk) {
      const int64_t pc = std::min(chunk, n_pairs - p0);
      differences_kernel<T><<<unsigned(pc), kThreads, 0, stream>>>(static_cast<const T*>(X), D, pi, pj, p0, b.diff,
                                                                   b.den);
      check_launch("differences_kernel");
      // Row-major lower L is column-major upper U = L^T; op(U) = U^T = L, so this solves L Y = diff.
      cublas::check(cublas::api().dtrsm(h, cublas::kSideLeft, cublas::kFillUpper, cublas::kOpT, cublas::kDiagNonUnit,
                                        int(D), int(pc), &one, chol_lower, int(D), b.diff, int(D)),
                    "cublasDtrsm (pair quotients)");
      quotient_kernel<<<unsigned(pc), kThreads, 0, stream>>>(b.diff, D, b.den, p0, out);
      check_launch("quotient_kernel");
    }
  });
}

}  // namespace dihal::cuda
