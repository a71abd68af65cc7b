/* The C interface between dihal_fast._cuda and libdihal_rmm_torch.so (rmm_torch.cpp): the torch
 * allocator callbacks and the entry points _cuda resolves with dlsym. Plain C so that the two
 * libraries share no C++ types. */
#pragma once
#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* allocate: `bytes` on `device`, stream-ordered on `stream` (sync != 0: usable on any stream when it
 * returns); NULL on failure with the reason in message[size]. deallocate: `ptr` from allocate, whose
 * last use is ordered on `stream` (NULL: no pending use). Called with no lock held. */
typedef struct DihalTorchAllocator {
  void* (*allocate)(void* context, int device, size_t bytes, cudaStream_t stream, int sync, char* message,
                    size_t size);
  void (*deallocate)(void* context, int device, void* ptr, size_t bytes, cudaStream_t stream);
  void* context;
} DihalTorchAllocator;

enum { DIHAL_RMM_FAILED = -1, DIHAL_RMM_KEPT = 0, DIHAL_RMM_ROUTED = 1 };

/* Makes `fns` RMM's resource of `device` unless a resource other than RMM's initial one is set:
 * DIHAL_RMM_ROUTED (now or before), DIHAL_RMM_KEPT (message: the kept resource's type) or
 * DIHAL_RMM_FAILED (message: why). */
typedef int (*DihalRmmRouteFn)(int device, DihalTorchAllocator fns, char* message, size_t size);

#ifdef __cplusplus
}
#endif
