// Objects kept per (device, stream) for the whole process (cuBLAS handles, cuVS resources): each is
// created on first use with its stream bound once, then reused by every call on that stream, so no
// call has to rebind a shared object (which would race between threads and streams). torch takes
// its streams from fixed pools, so the number of pairs stays small. Never destroyed: the driver may
// already be shut down when static destructors run.
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

namespace dihal::cuda {

template <typename V>
class PerStream {
 public:
  // The object of (device, stream), made by `make()` on first use (with `device` current: the
  // callers hold a DeviceGuard). An exception from `make` leaves nothing cached.
  template <typename Make>
  V get(int device, cudaStream_t stream, Make&& make) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto key = std::make_pair(device, stream);
    if (auto it = objects_.find(key); it != objects_.end()) return it->second;
    V object = make();
    objects_.emplace(key, object);
    return object;
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, cudaStream_t>, V> objects_;
};

}  // namespace dihal::cuda
