// NVTX ranges for the compiled kernels, named like the Python stages ("dihal/<stage>" in the
// "dihal_fast" domain, see dihal_fast/profiling.py). Header-only NVTX3 when its headers were found
// at build time (DIHAL_HAVE_NVTX3); otherwise the macro is a no-op. Without an attached profiler
// NVTX3 costs one predictable branch per range.
#pragma once

#if defined(DIHAL_HAVE_NVTX3) && DIHAL_HAVE_NVTX3
#include <nvtx3/nvToolsExt.h>

namespace dihal {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
    nvtxEventAttributes_t attributes{};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = name;
    nvtxDomainRangePushEx(domain(), &attributes);
  }
  ~NvtxRange() { nvtxDomainRangePop(domain()); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  static nvtxDomainHandle_t domain() {
    static const nvtxDomainHandle_t handle = nvtxDomainCreateA("dihal_fast");
    return handle;
  }
};

}  // namespace dihal

#define DIHAL_NVTX_RANGE(name) const ::dihal::NvtxRange dihal_nvtx_scope_(name)
#else
#define DIHAL_NVTX_RANGE(name) static_cast<void>(0)
#endif
