// cuVS's RMM resource through torch's caching allocator (see rmm_route.hpp and rmm_torch.cpp).
#include "rmm_route.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "rmm_route_abi.h"

namespace py = pybind11;

namespace dihal::cuda {
namespace {

std::mutex g_mutex;
std::map<int, std::string> g_routes;
// The stream each live block was allocated on: torch reuses a freed block in the order of that
// stream, so a block whose last use is on another stream waits for that stream before it is freed.
struct Block {
  cudaStream_t stream;
  size_t bytes;
};
std::mutex g_blocks_mutex;
std::unordered_map<void*, Block> g_blocks;
RouteStats g_stats;

// torch.cuda.caching_allocator_alloc / caching_allocator_delete, looked up once (with the GIL held);
// never released: Python may be gone when static destructors run.
struct TorchAllocator {
  py::object alloc, release;
};
const TorchAllocator& torch_allocator() {
  static const auto* fns = [] {
    const py::module_ cuda = py::module_::import("torch.cuda");
    return new TorchAllocator{cuda.attr("caching_allocator_alloc"), cuda.attr("caching_allocator_delete")};
  }();
  return *fns;
}

bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

void* torch_allocate(void*, int device, size_t bytes, cudaStream_t stream, int sync, char* message, size_t size) {
  void* ptr = nullptr;
  {
    py::gil_scoped_acquire gil;
    try {
      ptr = reinterpret_cast<void*>(
          torch_allocator().alloc(bytes, device, reinterpret_cast<uintptr_t>(stream)).cast<uintptr_t>());
    } catch (const py::error_already_set& e) {
      const std::string text = e.what();  // torch's error (out of memory, no GPU), without the traceback
      snprintf(message, size, "%s", text.substr(0, text.find("\n\nAt:")).c_str());
      return nullptr;
    }
  }
  // A cached block may still be read by earlier work of the default stream: wait for it.
  if (sync && cudaStreamSynchronize(stream) != cudaSuccess) {
    snprintf(message, size, "cudaStreamSynchronize of the default stream failed");
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_blocks_mutex);
  g_blocks[ptr] = Block{stream, bytes};
  g_stats.allocations += 1;
  g_stats.live_bytes += bytes;
  g_stats.peak_bytes = std::max(g_stats.peak_bytes, g_stats.live_bytes);
  return ptr;
}

void torch_deallocate(void*, int, void* ptr, size_t, cudaStream_t stream) {
  cudaStream_t allocated_on = stream;
  {
    std::lock_guard<std::mutex> lock(g_blocks_mutex);
    if (auto it = g_blocks.find(ptr); it != g_blocks.end()) {
      allocated_on = it->second.stream;
      g_stats.live_bytes -= it->second.bytes;
      g_blocks.erase(it);
    }
  }
  if (stream != nullptr && stream != allocated_on) cudaStreamSynchronize(stream);
  if (!python_alive()) return;  // process exit: the driver frees everything
  py::gil_scoped_acquire gil;
  try {
    torch_allocator().release(reinterpret_cast<uintptr_t>(ptr));
  } catch (const py::error_already_set&) {
    // deallocate is noexcept in RMM; a block torch does not know stays with torch (no double free)
  }
}

DihalRmmRouteFn route_function() {
  static DihalRmmRouteFn fn = [] {
    const std::string path = rmm_route_library();
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* err = dlerror();
      throw std::runtime_error("cuVS through torch's allocator: " + std::string(err ? err : path));
    }
    auto f = reinterpret_cast<DihalRmmRouteFn>(dlsym(lib, "dihal_rmm_route_to_torch"));
    if (!f) throw std::runtime_error(path + " lacks dihal_rmm_route_to_torch");
    return f;
  }();
  return fn;
}

}  // namespace

std::string rmm_route_library() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&rmm_route_library), &info) || !info.dli_fname) {
    throw std::runtime_error("cannot locate the dihal_fast._cuda module (dladdr failed)");
  }
  std::string dir = info.dli_fname;
  const auto slash = dir.rfind('/');
  dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  return dir + "/libdihal_rmm_torch.so";
}

std::string route_rmm_through_torch(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (auto it = g_routes.find(device); it != g_routes.end()) return it->second;
  {
    py::gil_scoped_acquire gil;
    torch_allocator();  // import torch.cuda now, not inside a cuVS call
  }
  const DihalTorchAllocator fns{&torch_allocate, &torch_deallocate, nullptr};
  char message[512] = {0};
  const int status = route_function()(device, fns, message, sizeof(message));
  if (status == DIHAL_RMM_FAILED) {
    throw std::runtime_error("cuVS through torch's allocator: setting RMM's resource of device " +
                             std::to_string(device) + " failed: " + message);
  }
  std::string route = status == DIHAL_RMM_ROUTED ? "torch" : std::string("kept: ") + message;
  g_routes[device] = route;
  return route;
}

RouteStats rmm_route_stats(bool reset_peak) {
  std::lock_guard<std::mutex> lock(g_blocks_mutex);
  const RouteStats stats = g_stats;
  if (reset_peak) g_stats.peak_bytes = g_stats.live_bytes;
  return stats;
}

std::map<int, std::string> rmm_routes() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_routes;
}

}  // namespace dihal::cuda
