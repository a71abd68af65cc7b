// Run-time loading of cuBLAS (see cublas.hpp).
#include "cublas.hpp"

#include "dynlib.hpp"
#include "per_stream.hpp"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>
#include <utility>

namespace dihal::cuda::cublas {
namespace {

std::mutex g_mutex;
Api g_api{};
bool g_loaded = false;
std::string g_path;
// One handle per (device, stream), bound to its stream once at creation: a shared handle would need
// cublasSetStream before each call, and two threads or torch streams could interleave the set and
// the launch (a GEMM on the wrong stream, or two streams writing cuBLAS's workspace of that handle
// at once). Each handle owns its workspace, used only in the order of its one stream (a stream
// pointer that is freed and handed out again names the new stream, which the handle then serves).
PerStream<Handle> g_handles;

// libcublas.so.N needs libcublasLt.so.N from the same folder, and the wheels carry no RUNPATH:
// open it first by full path so that the dependency resolves by soname.
void preload_lt(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return;
  std::string lt = path;
  const auto pos = lt.find("libcublas.so", slash);
  if (pos == std::string::npos) return;
  lt.replace(pos, std::string("libcublas.so").size(), "libcublasLt.so");
  dlopen(lt.c_str(), RTLD_NOW | RTLD_LOCAL);  // failure shows up when libcublas itself is opened
}

}  // namespace

std::string load(const std::vector<std::string>& candidates) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_loaded) return g_path;
  Api api{};
  const auto resolve = [&api](void* lib, std::string& missing) {
    dynlib::bind(lib, "cublasCreate_v2", api.create, missing);
    dynlib::bind(lib, "cublasSetStream_v2", api.set_stream, missing);
    dynlib::bind(lib, "cublasSetMathMode", api.set_math_mode, missing);
    dynlib::bind(lib, "cublasGetStatusString", api.status_string, missing);
    dynlib::bind(lib, "cublasGemmEx", api.gemm_ex, missing);
    dynlib::bind(lib, "cublasDsyrk_v2", api.dsyrk, missing);
    dynlib::bind(lib, "cublasDtrsm_v2", api.dtrsm, missing);
    return missing.empty();
  };
  g_path = dynlib::open_first(candidates, "cuBLAS", resolve, preload_lt);
  g_api = api;
  g_loaded = true;
  return g_path;
}

std::string loaded_path() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_path;
}

const Api& api() {
  if (!g_loaded) throw std::runtime_error("cuBLAS is not loaded (dihal_fast._cuda.load_cublas was not called)");
  return g_api;
}

Handle handle(int device, cudaStream_t stream) {
  const Api& a = api();
  return g_handles.get(device, stream, [&] {
    Handle h = nullptr;
    check(a.create(&h), "cublasCreate");
    check(a.set_stream(h, stream), "cublasSetStream");
    check(a.set_math_mode(h, kPedanticMath), "cublasSetMathMode (CUBLAS_PEDANTIC_MATH)");
    return h;
  });
}

void check(Status status, const char* what) {
  if (status == 0) return;
  const char* text = g_loaded && g_api.status_string ? g_api.status_string(status) : "unknown status";
  throw std::runtime_error(std::string(what) + " failed: " + text + " (cuBLAS status " + std::to_string(status) + ")");
}

}  // namespace dihal::cuda::cublas
