// Host emulation of the CUDA kNN pipeline (csrc/cuda/knn.cu), compiled into the CPU module so that
// its tests run on machines without nvcc or a GPU (knn_emulation.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "knn_logic.hpp"

namespace dihal {

// Input element types of the emulation (the CUDA kernels' dtype codes: float16, bfloat16, float32,
// float64); float16 and bfloat16 rows are passed as their raw 16-bit patterns.
enum class EmulatedInput : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2, kFloat64 = 3 };

struct EmulatedKnn {
  std::vector<int64_t> idx;          // n x k, the final answer (certified rows, others recomputed exactly)
  std::vector<double> sqdist;        // n x k
  std::vector<int64_t> cand_idx;     // n x k, the answer from the candidates alone (before the fallback)
  std::vector<int32_t> flags;        // n, 1 where the GPU recomputes the row exactly
  std::vector<double> threshold;     // n, the merged list threshold (scaled units)
  std::vector<double> kth_scaled;    // n, the k-th exact distance of the candidates, scaled
  std::vector<double> norms;         // n, the squared norms in W (scaled units)
  double max_norm2 = 0.0, scale = 1.0;
  knn_logic::Plan plan{};
};

// X is n x D row-major of `input` type; `tiling` is the kernel's (knn_logic::kTiling), or smaller
// blocks so that multi-tile paths run on small inputs; splits > 0 replaces the planner's number of
// splits (to test every split of small tiles), 0 keeps it. The tile GEMM accumulates each dot
// product in order with a fused multiply-add in the working type, as one cuBLAS thread would.
EmulatedKnn emulate_cuda_knn(const void* X, EmulatedInput input, int64_t n, int64_t D, int64_t k,
                             const knn_logic::Tiling& tiling, int64_t splits = 0);

}  // namespace dihal
