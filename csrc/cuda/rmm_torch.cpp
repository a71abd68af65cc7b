// libdihal_rmm_torch.so: routes RMM's per-device memory resource, which cuVS allocates its temporaries
// from, through torch's caching allocator (one pool per process instead of cudaMalloc beside torch's
// cache). A separate shared library because it must link librmm.so, the one the libcuvs wheels load:
// dihal_fast._cuda opens it (rmm_route.cpp) only after libcuvs_c.so is open, so librmm.so is already
// in the process and the DT_NEEDED below binds to that copy; _cuda itself never depends on RMM.
//
// One RMM state per process: RMM keeps the per-device resource map in static locals of exported
// inline functions (rmm::mr::detail::get_ref_map, ref_map_lock), which GCC emits as STB_GNU_UNIQUE
// symbols; the dynamic loader merges those across every library that defines them, RTLD_LOCAL or
// not, so the map written here is the one libcuvs reads (tests/test_cuvs_allocator.py checks the
// addresses). The names carry RMM's ABI namespace (_RMM_26_10): this library must be compiled
// against the librmm of the cuVS release compiled into _cuda (load_cuvs refuses any other).
//
// The allocation itself is a callback into _cuda (torch's allocator is reached through Python,
// torch.cuda.caching_allocator_alloc / _delete, i.e. raw_alloc_with_stream / raw_delete, so no torch
// C++ ABI is compiled in). Nothing here touches the CUDA runtime.
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/per_device_resource.hpp>

#include <cstddef>
#include <cstring>
#include <exception>
#include <string>
#include <typeinfo>

#include "rmm_route_abi.h"

namespace {

// An RMM device resource that forwards to the callbacks (torch's allocator). Copyable and small:
// RMM stores it by value in its per-device map.
class TorchResource {
 public:
  TorchResource(int device, DihalTorchAllocator fns) : device_(device), fns_(fns) {}

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment) {
    return take(bytes, alignment, stream.get(), 0);
  }
  void deallocate(cuda::stream_ref stream, void* ptr, std::size_t bytes, std::size_t) noexcept {
    if (ptr) fns_.deallocate(fns_.context, device_, ptr, bytes, stream.get());
  }
  // Synchronous: usable on any stream once it returns (the callback waits for the default stream).
  void* allocate_sync(std::size_t bytes, std::size_t alignment) { return take(bytes, alignment, nullptr, 1); }
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t) noexcept {
    if (ptr) fns_.deallocate(fns_.context, device_, ptr, bytes, nullptr);
  }

  bool operator==(const TorchResource& other) const noexcept {
    return device_ == other.device_ && fns_.allocate == other.fns_.allocate &&
           fns_.deallocate == other.fns_.deallocate && fns_.context == other.fns_.context;
  }
  bool operator!=(const TorchResource& other) const noexcept { return !(*this == other); }
  friend void get_property(const TorchResource&, cuda::mr::device_accessible) noexcept {}

 private:
  void* take(std::size_t bytes, std::size_t alignment, cudaStream_t stream, int sync) {
    if (bytes == 0) return nullptr;
    // torch's blocks start on 512-byte boundaries; RMM asks for 256 (CUDA_ALLOCATION_ALIGNMENT).
    if (alignment > kTorchAlignment || (alignment & (alignment - 1)) != 0) {
      throw rmm::bad_alloc("dihal_fast: torch's allocator gives 512-byte alignment, " + std::to_string(alignment) +
                           " was asked");
    }
    char message[512] = {0};
    void* ptr = fns_.allocate(fns_.context, device_, bytes, stream, sync, message, sizeof(message));
    if (!ptr) throw rmm::out_of_memory(std::string("torch's caching allocator: ") + message);
    return ptr;
  }

  static constexpr std::size_t kTorchAlignment = 512;
  int device_;
  DihalTorchAllocator fns_;
};

static_assert(cuda::mr::resource_with<TorchResource, cuda::mr::device_accessible>);
static_assert(cuda::mr::synchronous_resource_with<TorchResource, cuda::mr::device_accessible>);

void copy_message(const char* text, char* out, std::size_t size) {
  if (size == 0) return;
  std::strncpy(out, text, size - 1);
  out[size - 1] = '\0';
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int dihal_rmm_route_to_torch(int device, DihalTorchAllocator fns, char* message,
                                                                    std::size_t size) {
  try {
    const rmm::cuda_device_id id{device};
    const auto current = rmm::mr::get_per_device_resource_ref(id);
    if (current.type() == typeid(TorchResource)) return DIHAL_RMM_ROUTED;
    // Only RMM's initial resource (plain cudaMalloc) is replaced: one that somebody set on purpose
    // (a pool from rmm.reinitialize, another library's) is kept.
    if (current.type() != typeid(rmm::mr::cuda_memory_resource)) {
      copy_message(current.type().name(), message, size);
      return DIHAL_RMM_KEPT;
    }
    rmm::mr::set_per_device_resource(id, TorchResource{device, fns});
    return DIHAL_RMM_ROUTED;
  } catch (const std::exception& e) {
    copy_message(e.what(), message, size);
    return DIHAL_RMM_FAILED;
  }
}

// Self-checks (tests/test_cuvs_allocator.py, bench/gpu_check.sh): the address of RMM's per-device map
// as this library sees it (the loader merge), and one allocation of `bytes` through RMM's resource of
// `device`, freed at once (the pointer, or NULL with the reason in message).
__attribute__((visibility("default"))) const void* dihal_rmm_map_address() { return &rmm::mr::detail::get_ref_map(); }

__attribute__((visibility("default"))) void* dihal_rmm_allocate_probe(int device, std::size_t bytes, char* message,
                                                                     std::size_t size) {
  try {
    auto resource = rmm::mr::get_per_device_resource_ref(rmm::cuda_device_id{device});
    void* ptr = resource.allocate_sync(bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    resource.deallocate_sync(ptr, bytes, rmm::CUDA_ALLOCATION_ALIGNMENT);
    return ptr;
  } catch (const std::exception& e) {
    copy_message(e.what(), message, size);
    return nullptr;
  }
}

}  // extern "C"
