// Compile-time check of the cuBLAS declarations in cublas.hpp against the real cublas_api.h.
// Built only when the cuBLAS headers are found (CUDA toolkit or nvidia-cublas wheel); it contains
// no code, only static assertions. Enums and 32-bit integers are compared as 32-bit integers,
// which is how the C ABI passes them.
#include <cublas_v2.h>  // defines CUBLASAPI and includes cublas_api.h (CUDA 12's cublas_api.h alone is an #error)

#include <cstdint>
#include <type_traits>

#include "cublas.hpp"

namespace {

template <typename T, typename = void>
struct Normal {
  using type = T;
};
template <typename T>
struct Normal<T, std::enable_if_t<(std::is_enum_v<T> || std::is_integral_v<T>)&&sizeof(T) == 4>> {
  using type = std::int32_t;
};
template <typename T>
using normal_t = typename Normal<T>::type;

template <typename F>
struct NormalFn;
template <typename R, typename... A>
struct NormalFn<R (*)(A...)> {
  using type = normal_t<R> (*)(normal_t<A>...);
};
template <typename F>
using normal_fn_t = typename NormalFn<F>::type;

using dihal::cuda::cublas::Api;

template <typename Real, typename Ours>
constexpr bool same_abi = std::is_same_v<normal_fn_t<Real>, normal_fn_t<Ours>>;

static_assert(same_abi<decltype(&cublasCreate_v2), decltype(Api::create)>, "cublasCreate_v2");
static_assert(same_abi<decltype(&cublasSetStream_v2), decltype(Api::set_stream)>, "cublasSetStream_v2");
static_assert(same_abi<decltype(&cublasSetMathMode), decltype(Api::set_math_mode)>, "cublasSetMathMode");
static_assert(same_abi<decltype(&cublasGetStatusString), decltype(Api::status_string)>, "cublasGetStatusString");
// cublasGemmEx is overloaded in C++ (a wrapper taking cudaDataType as compute type): the cast
// selects the C entry point and fails to compile if it does not exist with this signature.
using GemmExReal = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                      const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                      cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
static_assert(same_abi<decltype(static_cast<GemmExReal>(&cublasGemmEx)), decltype(Api::gemm_ex)>, "cublasGemmEx");
static_assert(same_abi<decltype(&cublasDsyrk_v2), decltype(Api::dsyrk)>, "cublasDsyrk_v2");
static_assert(same_abi<decltype(&cublasDtrsm_v2), decltype(Api::dtrsm)>, "cublasDtrsm_v2");

namespace cb = dihal::cuda::cublas;
static_assert(CUBLAS_STATUS_SUCCESS == 0, "status");
static_assert(CUBLAS_OP_N == cb::kOpN && CUBLAS_OP_T == cb::kOpT, "cublasOperation_t");
static_assert(CUBLAS_FILL_MODE_LOWER == cb::kFillLower && CUBLAS_FILL_MODE_UPPER == cb::kFillUpper, "cublasFillMode_t");
static_assert(CUBLAS_SIDE_LEFT == cb::kSideLeft && CUBLAS_DIAG_NON_UNIT == cb::kDiagNonUnit, "side/diag");
static_assert(CUBLAS_COMPUTE_32F_PEDANTIC == cb::kCompute32FPedantic && CUBLAS_GEMM_DEFAULT == cb::kGemmDefault,
              "compute/algo");
static_assert(CUBLAS_COMPUTE_64F_PEDANTIC == cb::kCompute64FPedantic && CUBLAS_PEDANTIC_MATH == cb::kPedanticMath,
              "pedantic compute / math mode");

}  // namespace
