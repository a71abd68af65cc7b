// Small loops shared by the kernels, compiled for AVX-512, AVX2 and baseline x86-64 (the build
// targets the baseline; target_clones picks the best version when the module loads).
#include "kernels.hpp"

namespace dihal {
namespace {

// 32 independent partial sums (four AVX-512 or eight AVX2 registers of float64), so that the loop runs at
// the load and FMA throughput rather than at one add latency per vector; any order of these
// non-negative terms has the error bound that knn_logic's ErrorModel (5) assumes.
template <typename T>
__attribute__((always_inline)) inline double sqdist(const T* a, const T* b, int64_t len) {
  constexpr int64_t kLanes = 32;
  double acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= len; c += kLanes) {
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) {
      const double d = double(a[c + l]) - double(b[c + l]);
      acc[l] += d * d;
    }
  }
  for (int64_t l = 0; c + l < len; ++l) {
    const double d = double(a[c + l]) - double(b[c + l]);
    acc[l] += d * d;
  }
  for (int64_t width = kLanes / 2; width > 0; width /= 2)
#pragma omp simd
    for (int64_t l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

}  // namespace

__attribute__((target_clones("avx512f", "avx2", "default")))
double sqdist_exact(const float* a, const float* b, int64_t len) { return sqdist(a, b, len); }

__attribute__((target_clones("avx512f", "avx2", "default")))
double sqdist_exact(const double* a, const double* b, int64_t len) { return sqdist(a, b, len); }

}  // namespace dihal
