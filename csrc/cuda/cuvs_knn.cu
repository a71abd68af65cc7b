// cuVS brute-force candidates for the exact kNN (see cuvs_knn.hpp). The function pointer types
// come from the cuVS headers this was compiled against, so the library opened at run time must be
// the same cuVS release (checked by load_cuvs with cuvsVersionGet, see cuvs_version.hpp).
#include <cuvs/core/c_api.h>
#include <cuvs/neighbors/brute_force.h>
#include <cuvs/version_config.h>
#include <dlpack/dlpack.h>

#include <mutex>
#include <stdexcept>

#include "common.cuh"
#include "cuvs_knn.hpp"
#include "dynlib.hpp"
#include "per_stream.hpp"
#if DIHAL_HAVE_RMM_ROUTE
#include "rmm_route.hpp"
#endif

namespace dihal::cuda {
namespace {

struct CuvsApi {
  decltype(&cuvsResourcesCreate) resources_create;
  decltype(&cuvsResourcesDestroy) resources_destroy;
  decltype(&cuvsStreamSet) stream_set;
  decltype(&cuvsGetLastErrorText) last_error;
  decltype(&cuvsBruteForceIndexCreate) index_create;
  decltype(&cuvsBruteForceIndexDestroy) index_destroy;
  decltype(&cuvsBruteForceBuild) build;
  decltype(&cuvsBruteForceSearch) search;
  decltype(&cuvsVersionGet) version;
};

std::mutex g_mutex;
CuvsApi g_api{};
bool g_loaded = false;
std::string g_path;
// One cuVS resources object per (device, stream), reused (per_stream.hpp): creating one per call
// costs a cuBLAS handle, a stream pool and a workspace of cuVS's own each time.
PerStream<cuvsResources_t> g_resources;

const CuvsApi& api() {
  if (!g_loaded) throw std::runtime_error("cuVS is not loaded (dihal_fast._cuda.load_cuvs was not called)");
  return g_api;
}

void check(cuvsError_t status, const char* what) {
  if (status == CUVS_SUCCESS) return;
  const char* text = g_api.last_error ? g_api.last_error() : nullptr;
  throw std::runtime_error(std::string(what) + " failed: " + (text ? text : "unknown cuVS error"));
}

// A C-contiguous 2-D tensor view for the cuVS C API (no ownership: no deleter).
DLManagedTensor view(const void* data, DLDataTypeCode code, int bits, int64_t* shape, int device) {
  DLManagedTensor t{};
  t.dl_tensor.data = const_cast<void*>(data);
  t.dl_tensor.device = DLDevice{kDLCUDA, device};
  t.dl_tensor.ndim = 2;
  t.dl_tensor.dtype = DLDataType{uint8_t(code), uint8_t(bits), 1};
  t.dl_tensor.shape = shape;
  t.dl_tensor.strides = nullptr;
  t.dl_tensor.byte_offset = 0;
  return t;
}

// Thread per query: drop the query itself from the cap + 1 cuVS neighbours, keep cap (ascending);
// slots without a valid neighbour get +inf, which leaves the row uncertified.
__global__ void to_lists_kernel(const int64_t* nbr, const float* dist, int64_t nq, int64_t cap, int64_t q0,
                                int64_t n, float* merged_d, int32_t* merged_i) {
  const int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= nq) return;
  int64_t c = 0;
  for (int64_t e = 0; e <= cap && c < cap; ++e) {
    const int64_t j = nbr[q * (cap + 1) + e];
    if (j == q0 + q || j < 0 || j >= n) continue;
    merged_d[q * cap + c] = dist[q * (cap + 1) + e];
    merged_i[q * cap + c] = int32_t(j);
    ++c;
  }
  for (; c < cap; ++c) {
    merged_d[q * cap + c] = INFINITY;
    merged_i[q * cap + c] = -1;
  }
}

}  // namespace

std::string load_cuvs(const std::vector<std::string>& candidates) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_loaded) return g_path;
  CuvsApi a{};
  const auto resolve = [&a](void* lib, std::string& missing) {
    dynlib::bind(lib, "cuvsResourcesCreate", a.resources_create, missing);
    dynlib::bind(lib, "cuvsResourcesDestroy", a.resources_destroy, missing);
    dynlib::bind(lib, "cuvsStreamSet", a.stream_set, missing);
    dynlib::bind(lib, "cuvsGetLastErrorText", a.last_error, missing);
    dynlib::bind(lib, "cuvsBruteForceIndexCreate", a.index_create, missing);
    dynlib::bind(lib, "cuvsBruteForceIndexDestroy", a.index_destroy, missing);
    dynlib::bind(lib, "cuvsBruteForceBuild", a.build, missing);
    dynlib::bind(lib, "cuvsBruteForceSearch", a.search, missing);
    dynlib::bind(lib, "cuvsVersionGet", a.version, missing);
    if (!missing.empty()) return false;
    // The signatures above are those of the headers compiled in: another release may differ.
    uint16_t major = 0, minor = 0, patch = 0;
    if (a.version(&major, &minor, &patch) != CUVS_SUCCESS) {
      missing = "cuvsVersionGet failed";
      return false;
    }
    const std::string problem =
        version_problem(CUVS_VERSION_MAJOR, CUVS_VERSION_MINOR, CUVS_VERSION_PATCH, major, minor, patch,
                        CUDART_VERSION / 1000);
    if (!problem.empty()) missing = problem;  // open_first reports it and tries the next candidate
    return problem.empty();
  };
  g_path = dynlib::open_first(candidates, "cuVS (libcuvs_c.so)", resolve, [](const std::string&) {});
  g_api = a;
  g_loaded = true;
  return g_path;
}

std::string compiled_version() {
  return std::to_string(CUVS_VERSION_MAJOR) + "." + std::to_string(CUVS_VERSION_MINOR) + "." +
         std::to_string(CUVS_VERSION_PATCH);
}

uintptr_t resources(int device, cudaStream_t stream) {
  const CuvsApi& a = api();
  return g_resources.get(device, stream, [&] {
#if DIHAL_HAVE_RMM_ROUTE
    // Before cuVS's first resources object on the device: RAFT takes its workspace from RMM's
    // resource of the device, which from here on is torch's allocator (rmm_route.hpp).
    route_rmm_through_torch(device);
#endif
    cuvsResources_t res = 0;
    check(a.resources_create(&res), "cuvsResourcesCreate");
    if (a.stream_set(res, stream) != CUVS_SUCCESS) {
      const std::string text = a.last_error ? a.last_error() : "unknown cuVS error";
      a.resources_destroy(res);
      throw std::runtime_error("cuvsStreamSet failed: " + text);
    }
    return res;
  });
}

CuvsBruteForce::CuvsBruteForce(const float* centred, int64_t n, int64_t D, int device, cudaStream_t stream)
    : resources_(resources(device, stream)), data_(centred), n_(n), D_(D), device_(device), stream_(stream) {
  const CuvsApi& a = api();
  cuvsBruteForceIndex_t index = nullptr;
  try {
    check(a.index_create(&index), "cuvsBruteForceIndexCreate");
    index_ = index;
    int64_t shape[2] = {n, D};
    DLManagedTensor dataset = view(centred, kDLFloat, 32, shape, device);
    check(a.build(resources_, &dataset, L2Expanded, 0.0f, index), "cuvsBruteForceBuild");
  } catch (...) {
    if (index) a.index_destroy(index);
    throw;
  }
}

CuvsBruteForce::~CuvsBruteForce() {
  // Searches still queued may read the index: wait for them before it is freed (the resources
  // object stays, for the next call on this stream).
  cudaStreamSynchronize(stream_);
  g_api.index_destroy(static_cast<cuvsBruteForceIndex_t>(index_));
}

void CuvsBruteForce::candidates(int64_t q0, int64_t nq, int64_t cap, int64_t* nbr, float* dist, float* merged_d,
                                int32_t* merged_i, cudaStream_t stream) {
  const CuvsApi& a = api();
  int64_t query_shape[2] = {nq, D_}, out_shape[2] = {nq, cap + 1};
  DLManagedTensor queries = view(data_ + q0 * D_, kDLFloat, 32, query_shape, device_);
  DLManagedTensor neighbors = view(nbr, kDLInt, 64, out_shape, device_);
  DLManagedTensor distances = view(dist, kDLFloat, 32, out_shape, device_);
  cuvsFilter no_filter{0, NO_FILTER};
  check(a.search(resources_, static_cast<cuvsBruteForceIndex_t>(index_), &queries, &neighbors, &distances, no_filter),
        "cuvsBruteForceSearch");
  to_lists_kernel<<<unsigned(ceil_div(nq, 256)), 256, 0, stream>>>(nbr, dist, nq, cap, q0, n_, merged_d, merged_i);
  check_launch("to_lists_kernel");
}

}  // namespace dihal::cuda
