#!/usr/bin/env bash
# Link stubs of an older glibc, for builds whose modules must load on that glibc (manylinux_2_28):
#
#   bash packaging/glibc_stubs.sh DEST [GLIBC_VERSION]    # default 2.28; needs `pip install ziglang`
#
# zig generates, for any glibc version, shared-library stubs (libc.so.6, libm.so.6, libpthread.so.0, ...)
# that export exactly the symbols and symbol versions of that release. They are copied to DEST with the
# unversioned names the linker looks for (libc.so -> libc.so.6, ...); CMake's DIHAL_GLIBC_STUBS=DEST then
# links the modules against them (GCC still compiles, so OpenMP stays libgomp's). Prints DEST.
set -euo pipefail
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: $0 DEST [GLIBC_VERSION]" >&2; exit 2; }
dest=$1
version=${2:-2.28}
[[ $version =~ ^2\.[0-9]+$ ]] || { echo "GLIBC_VERSION must look like 2.28, got '$version'" >&2; exit 2; }
PY=${PYTHON:-python3}
"$PY" -m ziglang version >/dev/null 2>&1 || { echo "$PY has no ziglang (the glibc stubs' generator): $PY -m pip install ziglang" >&2; exit 1; }
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
printf 'int dihal_stub_probe(void) { return 0; }\n' > "$cache/probe.c"
# Linking any shared object for the target makes zig build that glibc's stubs into its cache.
ZIG_GLOBAL_CACHE_DIR=$cache/zig ZIG_LOCAL_CACHE_DIR=$cache/zig \
  "$PY" -m ziglang cc -target "x86_64-linux-gnu.$version" -shared -o "$cache/probe.so" "$cache/probe.c"
libc=$(find "$cache/zig" -name libc.so.6 | head -n 1)
[[ -n $libc ]] || { echo "zig built no libc.so.6 stub for glibc $version" >&2; exit 1; }
mkdir -p "$dest"
for stub in "$(dirname "$libc")"/*.so.*; do
  name=$(basename "$stub")
  cp "$stub" "$dest/$name"
  ln -sf "$name" "$dest/${name%%.so.*}.so"
done
# The stubs must be of the asked release: no symbol version above it.
top=$(objdump -T "$dest/libc.so.6" | grep -o 'GLIBC_2\.[0-9]*' | sort -V | tail -n 1)
[[ $top == "GLIBC_$version" ]] || { echo "the libc stub's newest symbol version is $top, not GLIBC_$version" >&2; exit 1; }
realpath "$dest"
