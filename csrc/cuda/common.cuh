// Shared pieces of the CUDA kernels: element types, error checks, the device guard, and a bump
// allocator over a caller-provided workspace (memory comes from torch's caching allocator, so all
// temporaries are stream-ordered on the caller's stream).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "dtype.hpp"

namespace dihal::cuda {

// Calls fn(T{}) with T the C++ type of dtype.
template <typename Fn>
void dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16: fn(__half{}); break;
    case DType::kBFloat16: fn(__nv_bfloat16{}); break;
    case DType::kFloat32: fn(float{}); break;
    case DType::kFloat64: fn(double{}); break;
  }
}

__host__ __device__ inline double to_double(__half x) { return double(__half2float(x)); }
__host__ __device__ inline double to_double(__nv_bfloat16 x) { return double(__bfloat162float(x)); }
__host__ __device__ inline double to_double(float x) { return double(x); }
__host__ __device__ inline double to_double(double x) { return x; }

template <typename T>
__host__ __device__ inline T from_double(double x);
template <>
__host__ __device__ inline float from_double<float>(double x) { return float(x); }
template <>
__host__ __device__ inline double from_double<double>(double x) { return x; }
template <>
__host__ __device__ inline __half from_double<__half>(double x) { return __double2half(x); }
template <>
__host__ __device__ inline __nv_bfloat16 from_double<__nv_bfloat16>(double x) { return __double2bfloat16(x); }

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Checks the launch of the kernel just issued (configuration errors; execution errors surface at
// the next synchronising call).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The driver's current context of the calling thread (cuCtxGetCurrent / cuCtxSetCurrent from
// libcuda.so.1, which the static runtime has loaded by the time a kernel runs); a CUcontext is an
// opaque pointer, so these are declared with void*.
struct DriverContext {
  using Get = int (*)(void**);
  using Set = int (*)(void*);
  Get get = nullptr;
  Set set = nullptr;

  static const DriverContext& api() {
    static const DriverContext d = [] {
      DriverContext r;
      void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
      if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
      if (lib) {
        r.get = reinterpret_cast<Get>(dlsym(lib, "cuCtxGetCurrent"));
        r.set = reinterpret_cast<Set>(dlsym(lib, "cuCtxSetCurrent"));
      }
      return r;
    }();
    return d;
  }
};

// Makes `device` current for the lifetime of the guard and then restores the thread's previous
// driver context exactly, without creating one: cudaSetDevice initialises the device's primary
// context (CUDA 12+), so restoring a previous device with it would create a context there (about
// 0.5 GB on GPU 0 for a process whose tensors live elsewhere). The static CUDA runtime shares the
// driver's thread-current context with torch's runtime; nothing is switched when it is already on
// `device`.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    const DriverContext& d = DriverContext::api();
    if (!d.get || !d.set) throw std::runtime_error("libcuda.so.1 (cuCtxGetCurrent/cuCtxSetCurrent) is not available");
    if (d.get(&previous_) != 0) previous_ = nullptr;
    int current = -1;
    if (previous_) check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != device) {
      check(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) DriverContext::api().set(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  void* previous_ = nullptr;
  bool switched_ = false;
};

// Carves aligned arrays out of one workspace. With base == nullptr it only counts, so the same
// code path that lays out the workspace also tells the caller how many bytes to allocate.
class Workspace {
 public:
  Workspace(void* base, size_t bytes) : base_(static_cast<char*>(base)), capacity_(bytes) {}

  template <typename T>
  T* take(int64_t count) {
    constexpr size_t kAlign = 256;
    used_ = (used_ + kAlign - 1) / kAlign * kAlign;
    const size_t size = size_t(count) * sizeof(T);
    T* ptr = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += size;
    if (base_ && used_ > capacity_)
      throw std::invalid_argument("workspace too small: need at least " + std::to_string(used_) + " bytes, got " +
                                  std::to_string(capacity_));
    return ptr;
  }
  size_t used() const { return used_; }
  bool counting() const { return base_ == nullptr; }

 private:
  char* base_;
  size_t capacity_;
  size_t used_ = 0;
};

constexpr unsigned kFullMask = 0xffffffffu;

// Sum over the warp; the result is valid in lane 0.
__device__ inline double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(kFullMask, v, offset);
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); valid in thread 0.
// `scratch` holds 32 doubles of shared memory.
__device__ inline double block_sum(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x >> 5) ? scratch[threadIdx.x] : 0.0;
  if (warp == 0) v = warp_sum(v);
  return v;
}

}  // namespace dihal::cuda
