// Element type codes of input matrices, shared with dihal_fast/geometry/backend_cuda.py.
#pragma once
#include <stdexcept>
#include <string>

namespace dihal::cuda {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2, kFloat64 = 3 };

inline DType dtype_from_code(int code) {
  if (code < 0 || code > 3) throw std::invalid_argument("unknown dtype code " + std::to_string(code));
  return static_cast<DType>(code);
}

}  // namespace dihal::cuda
