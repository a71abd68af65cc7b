// cuVS brute-force kNN candidates (compiled only when the cuVS headers were found at build time;
// libcuvs_c.so itself is opened at run time, so the module never depends on it to import).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuvs_version.hpp"

namespace dihal::cuda {

// Opens libcuvs_c.so (the first candidate that provides the C API of the cuVS release compiled in)
// and returns its path; throws std::runtime_error listing what was tried and why each failed.
std::string load_cuvs(const std::vector<std::string>& candidates);

// The cuVS version of the headers this module was compiled against ("26.10.0").
std::string compiled_version();

// The cuVS resources object of (device, stream), created on first use and then reused.
uintptr_t resources(int device, cudaStream_t stream);

// A cuVS brute-force (L2Expanded) index over the centred float32 rows, which must stay alive; it
// runs on the resources of (device, stream).
class CuvsBruteForce {
 public:
  CuvsBruteForce(const float* centred, int64_t n, int64_t D, int device, cudaStream_t stream);
  ~CuvsBruteForce();
  CuvsBruteForce(const CuvsBruteForce&) = delete;
  CuvsBruteForce& operator=(const CuvsBruteForce&) = delete;

  // Candidate lists of queries [q0, q0 + nq): the cap + 1 nearest rows from cuVS without the
  // query itself, cap per query, ascending (merged_d, merged_i: nq x cap). Every row left out has
  // a cuVS distance >= merged_d[q, cap - 1]. nbr / dist are scratch of nq x (cap + 1).
  void candidates(int64_t q0, int64_t nq, int64_t cap, int64_t* nbr, float* dist, float* merged_d,
                  int32_t* merged_i, cudaStream_t stream);

 private:
  uintptr_t resources_ = 0;
  void* index_ = nullptr;
  const float* data_;
  int64_t n_, D_;
  int device_;
  cudaStream_t stream_;
};

}  // namespace dihal::cuda
