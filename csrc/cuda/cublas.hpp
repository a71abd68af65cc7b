// cuBLAS, loaded at run time. The module links only the static CUDA runtime, so it builds without
// the cuBLAS headers and imports on machines without a GPU; libcublas.so.{13,12} is opened on the
// first use of the CUDA backend (from a CUDA build of torch, the nvidia-cublas wheels or the CUDA
// toolkit). The few entry points used here are declared below with their C ABI; when the real
// cuBLAS headers are present at build time, cublas_abi_check.cpp verifies these declarations.
#pragma once
#include <cuda_runtime.h>
#include <library_types.h>

#include <string>
#include <vector>

struct cublasContext;  // opaque, as in cublas_api.h

namespace dihal::cuda::cublas {

using Handle = cublasContext*;
using Status = int;  // cublasStatus_t; 0 is CUBLAS_STATUS_SUCCESS

// Enumerator values of cublas_api.h (stable across cuBLAS 11-13).
constexpr int kOpN = 0, kOpT = 1;              // cublasOperation_t
constexpr int kFillLower = 0, kFillUpper = 1;  // cublasFillMode_t
constexpr int kSideLeft = 0;                   // cublasSideMode_t
constexpr int kDiagNonUnit = 0;                // cublasDiagType_t
// The certificate of csrc/knn_logic.hpp assumes IEEE products and sums in the working type, rounded to
// nearest, with gradual underflow (no flush-to-zero), in any summation order. The PEDANTIC compute types
// pin that: cuBLAS may not down-convert inputs (TF32, bf16x9 or fixed-point emulation) nor reduce in a
// narrower type, whatever the handle's math mode or torch's TF32 flags. The private handles also run in
// CUBLAS_PEDANTIC_MATH, which covers the legacy entry points (cublasDsyrk, cublasDtrsm).
constexpr int kCompute32FPedantic = 69;        // cublasComputeType_t CUBLAS_COMPUTE_32F_PEDANTIC
constexpr int kCompute64FPedantic = 71;        // cublasComputeType_t CUBLAS_COMPUTE_64F_PEDANTIC
constexpr int kPedanticMath = 2;               // cublasMath_t CUBLAS_PEDANTIC_MATH
constexpr int kGemmDefault = -1;               // cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT

struct Api {
  Status (*create)(Handle*);                  // cublasCreate_v2
  Status (*set_stream)(Handle, cudaStream_t);  // cublasSetStream_v2
  Status (*set_math_mode)(Handle, int);        // cublasSetMathMode
  const char* (*status_string)(Status);        // cublasGetStatusString
  // cublasGemmEx
  Status (*gemm_ex)(Handle, int, int, int, int, int, const void*, const void*, cudaDataType, int, const void*,
                    cudaDataType, int, const void*, void*, cudaDataType, int, int, int);
  // cublasDsyrk_v2
  Status (*dsyrk)(Handle, int, int, int, int, const double*, const double*, int, const double*, double*, int);
  // cublasDtrsm_v2
  Status (*dtrsm)(Handle, int, int, int, int, int, int, const double*, const double*, int, double*, int);
};

// Opens the first candidate (a soname or a full path) that provides every entry point and returns
// it; throws std::runtime_error listing each candidate with the loader's reason otherwise.
std::string load(const std::vector<std::string>& candidates);

// The path loaded so far, empty before a successful load().
std::string loaded_path();

// The loaded API; throws when load() has not succeeded.
const Api& api();

// The cuBLAS handle of (`device`, `stream`): created on first use, bound to `stream` once and set to
// CUBLAS_PEDANTIC_MATH, so calls on different streams or threads never share a handle's stream setting
// or workspace.
Handle handle(int device, cudaStream_t stream);

// Throws std::runtime_error naming `what` when status is not success.
void check(Status status, const char* what);

}  // namespace dihal::cuda::cublas
