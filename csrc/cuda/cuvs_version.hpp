// Which libcuvs_c.so may serve a module compiled against given cuVS headers (host code only, no
// CUDA: exposed by the _cuda module as cuvs_version_problem so that the rule is tested anywhere).
//
// cuVS versions are RAPIDS releases YY.MM.patch, and its C API keeps neither signatures nor
// struct layouts across releases (cuvsBruteForceBuild, cuvsFilter and the index structs changed
// between 24.x and 25.x). The module calls the library through function pointers of the compiled
// headers' types, so the library must be the same release (major.minor); patch releases keep the
// API and may differ.
#pragma once
#include <string>

namespace dihal::cuda {

// "" when a library of version (major, minor, patch) may be used by code compiled against headers
// of (built_major, built_minor, built_patch); otherwise the reason, with the pip command that fixes it
// (the libcuvs wheel of the module's CUDA major).
inline std::string version_problem(int built_major, int built_minor, int built_patch, int major, int minor, int patch,
                                   int cuda_major) {
  if (major == built_major && minor == built_minor) return "";
  const auto text = [](int a, int b, int c) {
    std::string mm = std::to_string(a) + "." + (b < 10 ? "0" : "") + std::to_string(b);
    return c < 0 ? mm : mm + "." + std::to_string(c);
  };
  return "cuVS " + text(major, minor, patch) + ", but this module was compiled against cuVS " +
         text(built_major, built_minor, built_patch) + " (the C API changes between releases): pip install \"libcuvs-cu" + std::to_string(cuda_major) +
         "==" + text(built_major, built_minor, -1) + ".*\"";
}

}  // namespace dihal::cuda
