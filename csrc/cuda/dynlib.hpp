// Opening shared libraries at run time (cuBLAS, cuVS): the module has no link-time dependency on
// them, so it imports everywhere and names what is missing when a backend is first used.
#pragma once
#include <dlfcn.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace dihal::cuda::dynlib {

// Resolves `name` into `slot`; appends it to `missing` when the library lacks it.
template <typename Fn>
void bind(void* lib, const char* name, Fn& slot, std::string& missing) {
  slot = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!slot) missing += std::string(missing.empty() ? "" : ", ") + name;
}

// Opens the candidates (sonames or full paths) in order until `resolve(lib, missing)` finds every
// symbol; returns the candidate that worked, or throws std::runtime_error listing each candidate
// with the loader's reason. `before(candidate)` runs before each attempt (to preload a dependency).
template <typename Resolve, typename Before>
std::string open_first(const std::vector<std::string>& candidates, const char* what, Resolve&& resolve,
                       Before&& before) {
  std::string reasons;
  for (const std::string& candidate : candidates) {
    before(candidate);
    void* lib = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* err = dlerror();
      reasons += "\n  " + candidate + ": " + (err ? err : "dlopen failed");
      continue;
    }
    std::string missing;
    if (resolve(lib, missing)) return candidate;
    reasons += "\n  " + candidate + ": missing symbols " + missing;
    dlclose(lib);
  }
  throw std::runtime_error(std::string("could not load ") + what + "; tried:" + reasons);
}

}  // namespace dihal::cuda::dynlib
