// cuVS temporaries through torch's caching allocator (compiled when cuVS and the RMM headers were
// found: DIHAL_HAVE_RMM_ROUTE). cuVS allocates through RMM's per-device resource, by default a
// cudaMalloc of its own beside torch's cache; route_rmm_through_torch(device) makes that resource
// torch's allocator (torch.cuda.caching_allocator_alloc / caching_allocator_delete: torch's
// raw_alloc_with_stream / raw_delete), so the workspace shows in torch.cuda.memory_stats() and cannot
// run out of memory that torch holds in its cache.
//
// Once per device, before its first cuVS resources object, never undone: the resource stays for the
// process (as the per-stream cuBLAS handles and cuVS resources do). It is process-wide RMM state, so
// other RMM users on that device (cuDF, CuPy through RMM) then allocate through torch as well; a
// resource somebody set on purpose before (a pool from rmm.reinitialize) is kept and reported.
#pragma once
#include <cstddef>
#include <map>
#include <string>

namespace dihal::cuda {

// "torch" (RMM's resource of `device` is torch's allocator) or "kept: <type>" (another resource was set
// before and stays); throws std::runtime_error when libdihal_rmm_torch.so cannot be opened or fails.
std::string route_rmm_through_torch(int device);

// The route of every device routed so far (device -> what route_rmm_through_torch returned).
std::map<int, std::string> rmm_routes();

// What went through the route, all devices: allocations made, bytes held now, the most held at once
// (since the last reset_peak).
struct RouteStats {
  size_t allocations = 0, live_bytes = 0, peak_bytes = 0;
};
RouteStats rmm_route_stats(bool reset_peak);

// The full path of libdihal_rmm_torch.so beside this module.
std::string rmm_route_library();

}  // namespace dihal::cuda
