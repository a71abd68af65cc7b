// Opening shared libraries at run time (cuBLAS, cuVS): the module has no link-time dependency on
// them, so it imports everywhere and names what is missing when a backend is first used.
#pragma once
#include <dlfcn.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace dihal::cuda::dynlib {

// Resolves `name` into `slot`; adds it to `missing` ("missing symbols a, b") when the library lacks it.
template <typename Fn>
void bind(void* lib, const char* name, Fn& slot, std::string& missing) {
  slot = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!slot) missing += std::string(missing.empty() ? "missing symbols " : ", ") + name;
}

// Opens the candidates (sonames or full paths) in order until `resolve(lib, why)` accepts one (finds
// every symbol, or whatever else it checks; when not, `why` says what is wrong); returns the candidate
// that worked, or throws std::runtime_error listing each candidate with the loader's or resolve's reason. `before(candidate)` runs before each attempt (to preload a dependency).
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
    reasons += "\n  " + candidate + ": " + missing;
    dlclose(lib);
  }
  throw std::runtime_error(std::string("could not load ") + what + "; tried:" + reasons);
}

}  // namespace dihal::cuda::dynlib
