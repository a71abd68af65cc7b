// pybind11 entry points of the CUDA backend (module dihal_fast._cuda). Linked against the static
// CUDA runtime only, so it imports on machines without a driver; cuBLAS (and cuVS) are opened at
// run time by load_cublas / load_cuvs. Device buffers arrive as integer addresses of torch tensors
// with the caller's current stream; argument checking that users see happens in
// dihal_fast/geometry/backend_cuda.py, the checks here guard the kernels against misuse.
#include <cuda_runtime.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cublas.hpp"
#include "cuvs_version.hpp"
#include "knn_logic.hpp"
#include "ops.hpp"
#if DIHAL_HAVE_CUVS
#include "cuvs_knn.hpp"
#endif
#if DIHAL_HAVE_RMM_ROUTE
#include "rmm_route.hpp"
#endif

namespace py = pybind11;
using std::int64_t;
using dihal::cuda::DType;

namespace {

template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

cudaStream_t as_stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// (number of usable devices, reason when there is none).
py::tuple device_count() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess && count > 0) return py::make_tuple(count, std::string());
  std::string reason = err == cudaSuccess ? "no CUDA device is visible" : cudaGetErrorString(err);
  int driver = 0;
  cudaDriverGetVersion(&driver);
  if (driver == 0) {
    reason += " (no NVIDIA driver: libcuda.so.1 could not be loaded)";
  } else if (err == cudaErrorInsufficientDriver) {
    reason += " (the driver supports CUDA " + version_string(driver) + ", this build needs CUDA " +
              version_string(CUDART_VERSION) + ": update the driver or install a build for an older CUDA)";
  }
  return py::make_tuple(0, reason);
}

py::dict build_info() {
  py::dict info;
  info["cuda_runtime_version"] = CUDART_VERSION;
  info["cuda_architectures"] = std::string(DIHAL_CUDA_ARCHITECTURES);
  info["cuvs_compiled"] = dihal::cuda::cuvs_compiled();
#if DIHAL_HAVE_CUVS
  info["cuvs_version"] = dihal::cuda::compiled_version();  // the headers'; the library must be that release
#else
  info["cuvs_version"] = std::string();
#endif
  // Where cuVS's temporaries come from (rmm_route.hpp); cuvs_allocator_routes() says per device.
#if DIHAL_HAVE_RMM_ROUTE
  info["cuvs_allocator"] = std::string("torch (RMM resource per device, set at its first cuVS use)");
#elif DIHAL_HAVE_CUVS
  info["cuvs_allocator"] = std::string("rmm default (cudaMalloc beside torch's cache)");
#else
  info["cuvs_allocator"] = std::string();
#endif
  info["nvtx"] = bool(DIHAL_HAVE_NVTX3);
  info["cublas_loaded"] = dihal::cuda::cublas::loaded_path();
  return info;
}

std::string load_cuvs(const std::vector<std::string>& candidates) {
#if DIHAL_HAVE_CUVS
  return dihal::cuda::load_cuvs(candidates);
#else
  (void)candidates;
  throw std::runtime_error("this build has no cuVS support (libcuvs was not found when it was compiled)");
#endif
}

size_t covariance_workspace(int64_t n, int64_t D, int dtype, bool exact) {
  return dihal::cuda::covariance_workspace(n, D, dihal::cuda::dtype_from_code(dtype), exact);
}

int64_t covariance_update(uintptr_t X, int dtype, int64_t n, int64_t D, int64_t count, uintptr_t mean,
                          uintptr_t comoment, bool exact, uintptr_t ws, size_t ws_bytes, int device, uintptr_t stream) {
  return dihal::cuda::covariance_update(ptr<const void>(X), dihal::cuda::dtype_from_code(dtype), n, D, count,
                                        ptr<double>(mean), ptr<double>(comoment), exact, ptr<void>(ws), ws_bytes,
                                        device, as_stream(stream));
}

size_t knn_workspace(int64_t n, int64_t D, int64_t k, int dtype, bool use_cuvs) {
  return dihal::cuda::knn_workspace(n, D, k, dihal::cuda::dtype_from_code(dtype), use_cuvs);
}

void knn_candidates(uintptr_t X, int dtype, int64_t n, int64_t D, int64_t k, uintptr_t idx, uintptr_t d2,
                    uintptr_t flags, bool use_cuvs, uintptr_t ws, size_t ws_bytes, int device, uintptr_t stream) {
  dihal::cuda::knn_candidates(ptr<const void>(X), dihal::cuda::dtype_from_code(dtype), n, D, k, ptr<int64_t>(idx),
                              ptr<double>(d2), ptr<int32_t>(flags), use_cuvs, ptr<void>(ws), ws_bytes, device,
                              as_stream(stream));
}

void exact_sqdist_rows(uintptr_t X, int dtype, int64_t n, int64_t D, uintptr_t rows, int64_t n_rows, uintptr_t out,
                       int device, uintptr_t stream) {
  dihal::cuda::exact_sqdist_rows(ptr<const void>(X), dihal::cuda::dtype_from_code(dtype), n, D,
                                 ptr<const int64_t>(rows), n_rows, ptr<double>(out), device,
                                 as_stream(stream));
}

void local_top_eigenvalues(uintptr_t X, int dtype, int64_t n, int64_t D, uintptr_t idx, int64_t k, uintptr_t out,
                           int device, uintptr_t stream) {
  dihal::cuda::local_top_eigenvalues(ptr<const void>(X), dihal::cuda::dtype_from_code(dtype), n, D,
                                     ptr<const int64_t>(idx), k, ptr<double>(out), device,
                                     as_stream(stream));
}

void pair_quotients(uintptr_t X, int dtype, int64_t n, int64_t D, uintptr_t chol_lower, uintptr_t pi, uintptr_t pj,
                    int64_t n_pairs, uintptr_t out, uintptr_t ws, size_t ws_bytes, int device, uintptr_t stream) {
  dihal::cuda::pair_quotients(ptr<const void>(X), dihal::cuda::dtype_from_code(dtype), n, D,
                              ptr<const double>(chol_lower), ptr<const int64_t>(pi), ptr<const int64_t>(pj), n_pairs,
                              ptr<double>(out), ptr<void>(ws), ws_bytes, device, as_stream(stream));
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "dihal_fast CUDA kernels (static CUDA runtime; cuBLAS/cuVS opened at run time)";
  m.def("device_count", &device_count, "(number of usable CUDA devices, reason when 0)");
  m.def("build_info", &build_info);
  m.def("load_cublas", &dihal::cuda::cublas::load, py::arg("candidates"),
        "Open the first cuBLAS candidate (soname or path) that works; returns it, raises RuntimeError otherwise");
  m.def("load_cuvs", &load_cuvs, py::arg("candidates"),
        "Open the first libcuvs_c.so candidate of the cuVS release compiled in; returns it, raises RuntimeError "
        "naming each candidate's problem otherwise");
  m.def(
      "cuvs_version_problem",
      [](std::tuple<int, int, int> built, std::tuple<int, int, int> loaded, int cuda_major) {
        return dihal::cuda::version_problem(std::get<0>(built), std::get<1>(built), std::get<2>(built),
                                            std::get<0>(loaded), std::get<1>(loaded), std::get<2>(loaded),
                                            cuda_major);
      },
      py::arg("built"), py::arg("loaded"), py::arg("cuda_major"),
      "'' when a cuVS library of version `loaded` may serve code compiled against `built`, else the reason "
      "(the rule load_cuvs applies)");
  m.def(
      "cuvs_allocator_routes",
      [] {
#if DIHAL_HAVE_RMM_ROUTE
        return dihal::cuda::rmm_routes();
#else
        return std::map<int, std::string>();
#endif
      },
      "{device: 'torch' or 'kept: <resource type>'} of every device cuVS has used (RMM's resource there)");
#if DIHAL_HAVE_RMM_ROUTE
  m.def("route_cuvs_allocator", &dihal::cuda::route_rmm_through_torch, py::arg("device"),
        "Make RMM's resource of `device` torch's caching allocator now (cuVS does it at its first use there); "
        "needs librmm.so loaded (libcuvs.load_library or librmm.load_library). Returns the route");
  m.def("rmm_route_library", &dihal::cuda::rmm_route_library, "The path of libdihal_rmm_torch.so");
  m.def(
      "cuvs_allocator_stats",
      [](bool reset_peak) {
        const auto s = dihal::cuda::rmm_route_stats(reset_peak);
        py::dict d;
        d["allocations"] = s.allocations;
        d["live_bytes"] = s.live_bytes;
        d["peak_bytes"] = s.peak_bytes;
        return d;
      },
      py::arg("reset_peak") = false,
      "What cuVS (RMM) allocated through torch: allocations, bytes held now, most held at once (since a reset)");
#endif
  m.attr("MAX_KNN_CANDIDATES") = dihal::cuda::kMaxKnnCandidates;
  m.attr("MAX_LOCAL_POINTS") = dihal::cuda::kMaxLocalPoints;
  m.def("knn_capacity", &dihal::knn_logic::capacity, py::arg("n"), py::arg("k"));
  m.def("covariance_workspace", &covariance_workspace, py::arg("n"), py::arg("D"), py::arg("dtype"), py::arg("exact"));
  m.def("covariance_update", &covariance_update, py::arg("X"), py::arg("dtype"), py::arg("n"), py::arg("D"),
        py::arg("count"), py::arg("mean"), py::arg("comoment"), py::arg("exact"), py::arg("workspace"),
        py::arg("workspace_bytes"), py::arg("device"), py::arg("stream"));
  m.def("knn_workspace", &knn_workspace, py::arg("n"), py::arg("D"), py::arg("k"), py::arg("dtype"),
        py::arg("use_cuvs"));
  m.def("knn_candidates", &knn_candidates, py::arg("X"), py::arg("dtype"), py::arg("n"), py::arg("D"), py::arg("k"),
        py::arg("idx"), py::arg("d2"), py::arg("flags"), py::arg("use_cuvs"), py::arg("workspace"),
        py::arg("workspace_bytes"), py::arg("device"), py::arg("stream"));
  m.def("exact_sqdist_rows", &exact_sqdist_rows, py::arg("X"), py::arg("dtype"), py::arg("n"), py::arg("D"),
        py::arg("rows"), py::arg("n_rows"), py::arg("out"), py::arg("device"), py::arg("stream"));
  m.def("local_top_eigenvalues", &local_top_eigenvalues, py::arg("X"), py::arg("dtype"), py::arg("n"), py::arg("D"),
        py::arg("idx"), py::arg("k"), py::arg("out"), py::arg("device"), py::arg("stream"));
  m.def("pair_workspace", &dihal::cuda::pair_workspace, py::arg("D"), py::arg("n_pairs"));
  m.def("pair_quotients", &pair_quotients, py::arg("X"), py::arg("dtype"), py::arg("n"), py::arg("D"),
        py::arg("chol_lower"), py::arg("pi"), py::arg("pj"), py::arg("n_pairs"), py::arg("out"), py::arg("workspace"),
        py::arg("workspace_bytes"), py::arg("device"), py::arg("stream"));
}
