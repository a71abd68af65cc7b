// Small loops shared by the kernels, compiled for AVX-512, AVX2 and baseline x86-64 (the build
// targets the baseline; target_clones picks the best version when the module loads).
#include "kernels.hpp"

namespace dihal {
namespace {

template <typename T>
__attribute__((always_inline)) inline double sqdist(const T* a, const T* b, int64_t len) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < len; ++c) {
    const double d = double(a[c]) - double(b[c]);
    s += d * d;
  }
  return s;
}

}  // namespace

__attribute__((target_clones("avx512f", "avx2", "default")))
double sqdist_exact(const float* a, const float* b, int64_t len) { return sqdist(a, b, len); }

__attribute__((target_clones("avx512f", "avx2", "default")))
double sqdist_exact(const double* a, const double* b, int64_t len) { return sqdist(a, b, len); }

}  // namespace dihal
