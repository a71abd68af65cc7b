// Linked only into portable builds (CMake DIHAL_GLIBC_STUBS, packaging/build_wheels.sh): the modules link
// against glibc 2.28's stubs and a newer GCC's static libstdc++ and headers, which use glibc symbols that
// 2.28 lacks. They are defined here, local to the module (hidden), so the module loads on glibc 2.28:
// - __libc_single_threaded (glibc 2.32), read to skip atomic reference counts in a single-threaded
//   process: 0 means "other threads may exist", so libstdc++ always takes the atomic path, correct anywhere;
// - arc4random (glibc 2.36), called by std::random_device (whose object file comes in with std::string's
//   code): the same random words from the kernel through getrandom (glibc 2.25);
// - fstat64 (a function since glibc 2.33; before, the headers' inline wrapper of __fxstat64), called by
//   RMM's logger headers in libdihal_rmm_torch.so: the same wrapper, __fxstat64 being in every glibc.
#include <sys/random.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;

__attribute__((visibility("hidden"))) uint32_t arc4random(void) {
  uint32_t value = 0;
  while (getrandom(&value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) {
    if (errno != EINTR) std::abort();  // as glibc's arc4random: no fallback to a weaker source
  }
  return value;
}

int __fxstat64(int version, int fd, struct stat64* buf);  // glibc 2.2.5 onwards (a compat symbol since 2.33)

__attribute__((visibility("hidden"))) int fstat64(int fd, struct stat64* buf) {
  return __fxstat64(1, fd, buf);  // 1: _STAT_VER of x86_64, the struct stat64 layout of every glibc
}
}
