// CUDA backend module. Linked against the static CUDA runtime, so it imports on machines without
// a driver; device_count() then reports 0 and the reason.
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>

#include <string>

namespace py = pybind11;

namespace {

py::tuple device_count() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return py::make_tuple(0, std::string(cudaGetErrorString(err)));
  return py::make_tuple(count, std::string(""));
}

py::dict build_info() {
  py::dict info;
  info["cuda_runtime_version"] = CUDART_VERSION;
  return info;
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "dihal_fast CUDA kernels";
  m.def("device_count", &device_count, "(number of visible CUDA devices, reason when 0)");
  m.def("build_info", &build_info);
}
