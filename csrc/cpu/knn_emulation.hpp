// Host emulation of the CUDA kNN pipeline (csrc/cuda/knn.cu), compiled into the CPU module so that
// its tests run on machines without nvcc or a GPU (knn_emulation.cpp).
#pragma once
#include <cstdint>
#include <vector>

namespace dihal {

struct EmulatedKnn {
  std::vector<int64_t> idx;     // n x k
  std::vector<double> sqdist;   // n x k
  std::vector<int32_t> flags;   // n, 1 where the GPU would recompute the row exactly
};

// X is n x D row-major float32 (is_double false) or float64; query_block / ref_block / splits are
// the tiling of the kernel being emulated.
EmulatedKnn emulate_cuda_knn(const void* X, bool is_double, int64_t n, int64_t D, int64_t k, int64_t query_block,
                             int64_t ref_block, int64_t splits);

}  // namespace dihal
