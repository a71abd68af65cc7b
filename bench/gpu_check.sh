#!/usr/bin/env bash
# The prepared GPU check of the CUDA backend (about 6-8 minutes on one H100/H200 without --full):
#   1. build the package with DIHAL_CUDA=ON (sm_80 and sm_90, plus this GPU's architecture when it
#      is newer; in place, editable, with the machine's torch),
#   2. the first-run checks (each under its own timeout):
#      a. the adversarial kNN certificate families on cuda and cuvs, with TF32 allowed and not,
#      b. multi-tile kNN, covariance (float64 SYRK; float32 and float16 GEMM, float16 rows past 2^15 that
#         need the block scale) and local eigenvalues (block Jacobi, 17 and 64 points) on three side
#         streams from three threads at once vs the reference, under compute-sanitizer memcheck and
#         racecheck (tools/gpu_first_run.py streams),
#      c. a large-index smoke, n * D > 2^31 bfloat16 rows: kNN and covariance, time and peak memory
#         (tools/gpu_first_run.py large),
#      d. the device guard: a kernel called from a fresh thread leaves its current context none (or device
#         0's, with two GPUs) and creates no context on a device it does not use (tools/gpu_first_run.py guard),
#      e. cuVS through torch's allocator: during a cuVS kNN its temporaries are torch-allocated
#         (torch.cuda.memory_stats), max_memory_reserved stays within the bound and cudaMemGetInfo's free
#         memory drops by no more than torch reserved (tests/test_cuvs_allocator.py; needs the libcuvs
#         wheel of the build's cuVS release installed, e.g. pip install "libcuvs-cu13==26.10.*"),
#   3. run the CUDA tests with skips turned into failures (DIHAL_REQUIRE_GPU=1),
#   4. with --full only: time every kernel against its floor, torch and cuVS (bench/bench_gpu.py) and
#      profile a small locate pass (bench/profile_locate.py),
# writing their records (figures, command, commit, machine) to bench/results/. The log and those records
# are also copied to $OUT when it is set (the device tool brings that folder back). The log ends with a
# summary: one line per check (ok / FAILED) and "NOT RUN: cuvs (reason)" when cuVS cannot run after the
# build (not compiled in, libcuvs / librmm not installed, or get_backend("cuvs") refused). A run without
# cuVS exits non-zero unless --no-cuvs says that is intended; with cuVS usable, skips of the cuvs cases
# become failures (DIHAL_REQUIRE_CUVS=1).
#
#   bash bench/gpu_check.sh                 # on the GPU machine
#   bash bench/gpu_check.sh --full          # plus step 4
#   bash bench/gpu_check.sh --no-cuvs       # accept a run without cuVS (exit 0 when the rest passes)
#   bash bench/gpu_check.sh --fetch-wheels  # on a networked machine: wheels the GPU image lacks -> .whl/
#   bash bench/gpu_check.sh --help          # this text
#
# A GPU machine without network gets missing Python packages from .whl/ (carried along; see
# --fetch-wheels), installed into /tmp/site and put on PYTHONPATH. With this workplace's device
# tool: `bash bench/gpu_check.sh --fetch-wheels` here, then run `bash bench/gpu_check.sh` there
# with carry [".whl"] and a timeout of about 540 s; copy $OUT/results/*.json back into bench/results/ and
# run `python bench/render_results.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEEL_PY=${WHEEL_PY:-3.12}
NEEDED="scipy-openblas32 nvtx"

usage() { sed -n '2,/^set -euo pipefail/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }
full=0 no_cuvs=0 fetch=0
for arg in "$@"; do
  case $arg in
    --full) full=1 ;;
    --no-cuvs) no_cuvs=1 ;;
    --fetch-wheels) fetch=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown option: $arg (expected --full, --no-cuvs, --fetch-wheels or --help)" >&2; exit 2 ;;
  esac
done

if [[ $fetch == 1 ]]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  for pkg in $NEEDED; do
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version "$WHEEL_PY" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "$pkg"
  done
  exit 0
fi

LOG=${OUT:-/tmp}/gpu_check.log
exec > >(tee "$LOG") 2>&1
echo "== $(date -u +%FT%TZ) gpu_check on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
for mod in torch scipy_openblas32 nvtx scikit_build_core pybind11 pytest hypothesis transformers; do
  "$PY" -c "import $mod" 2>/dev/null || { echo "missing Python package: $mod (see --fetch-wheels)"; exit 1; }
done

# The default architectures (80-real;90) cover A100/H100/H200; a newer GPU adds its own.
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d '.' || true)
ARCHS="80-real;90"
[[ -n "$ARCH" && "$ARCH" != 80 && "$ARCH" != 90 ]] && ARCHS="80-real;90-real;$ARCH"
echo "== build (DIHAL_CUDA=ON, $ARCHS)"
start=$(date +%s)
DIHAL_CUDA=ON "$PY" -m pip install --no-build-isolation --no-deps -e . \
  -Ccmake.define.DIHAL_CUDA_ARCHITECTURES="$ARCHS" 2>&1 | tail -n 3
echo "build seconds: $(( $(date +%s) - start ))"
"$PY" -c "import dihal_fast, json; print(json.dumps(dihal_fast.build_info()['backends'], indent=1))"

# cuVS after the build: why it cannot run here (empty when it can). The cuvs checks need the backend
# (libcuvs_c.so of the compiled release, cuBLAS, a device) and librmm (the allocator route).
cuvs_reason=$("$PY" - <<'PYEOF'
import importlib.util

import dihal_fast
from dihal_fast.geometry.backends import get_backend

info = dihal_fast.build_info()["backends"]["cuvs"]
missing = [m for m in ("libcuvs", "librmm") if importlib.util.find_spec(m) is None]
if not info["compiled"]:
    print(f"{info['reason']}; pip install \"libcuvs-cu13==26.10.*\" (or -cu12) before the build")
elif missing:
    print(f"no {' / '.join(missing)} wheel in this Python; pip install \"libcuvs-cu13==26.10.*\" (or -cu12)")
else:
    try:
        get_backend("cuvs")
    except dihal_fast.BackendUnavailable as exc:
        print(str(exc).replace("\n", " "))
PYEOF
) || cuvs_reason="the cuVS probe failed (see above)"
require_cuvs=(); [[ -z $cuvs_reason ]] && require_cuvs=(DIHAL_REQUIRE_CUVS=1)
echo "== cuVS: ${cuvs_reason:-usable}"

status=0
summary=()
step() {  # step SECONDS NAME COMMAND...: run one check under a timeout, keep going, remember failures
  local limit=$1 name=$2; shift 2
  echo "== $name"
  local t0 rc=0; t0=$(date +%s)
  timeout "$limit" "$@" || rc=$?
  local took=$(( $(date +%s) - t0 ))
  echo "$name seconds: $took"
  if [[ $rc == 0 ]]; then summary+=("ok: $name (${took} s)")
  else echo "FAILED ($rc): $name"; summary+=("FAILED ($rc): $name (${took} s)"); status=1; fi
}
# TF32 not allowed: NVIDIA_TF32_OVERRIDE=0 (cuBLAS and cuVS) and torch's flags off; allowed: torch's flags on.
for tf32 in 0 1; do
  override=(); [[ $tf32 == 0 ]] && override=(NVIDIA_TF32_OVERRIDE=0)
  step 90 "adversarial kNN certificate, TF32 allowed=$tf32" env "${override[@]}" "${require_cuvs[@]}" \
    DIHAL_TEST_TF32=$tf32 DIHAL_REQUIRE_GPU=1 "$PY" -m pytest -rs -q -p no:cacheprovider tests/test_geometry_kernels.py \
    -k "adversarial and (cuda- or cuvs-)"
done
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  step 150 "side streams (kNN, covariance, local eigen) under compute-sanitizer $tool" \
    "$SANITIZER" --tool "$tool" --error-exitcode 3 "$PY" tools/gpu_first_run.py streams
done
step 120 "large-index smoke (bfloat16, n * D > 2^31)" "$PY" tools/gpu_first_run.py large
step 60 "device guard (no context created on an unused device)" "$PY" tools/gpu_first_run.py guard
if [[ -z $cuvs_reason ]]; then
  step 120 "cuVS through torch's allocator" env DIHAL_REQUIRE_GPU=1 "$PY" -m pytest -q -s -rs -p no:cacheprovider \
    tests/test_cuvs_allocator.py
fi

step 180 "CUDA tests" env "${require_cuvs[@]}" DIHAL_REQUIRE_GPU=1 "$PY" -m pytest -q -rs -p no:cacheprovider \
  tests/test_geometry_kernels.py tests/test_cuda_build.py tests/test_profiling.py

if [[ $full == 1 ]]; then
  step 300 "kernel timings" "$PY" bench/bench_gpu.py
  step 200 "locate profile" "$PY" bench/profile_locate.py --max-tokens 16384 --repeats 3 --sample-size 2000
fi

if [[ -n "${OUT:-}" ]]; then mkdir -p "$OUT/results" && cp bench/results/*.json "$OUT/results/"; fi
echo "== summary"
printf '%s\n' "${summary[@]}"
if [[ -n $cuvs_reason ]]; then
  echo "NOT RUN: cuvs ($cuvs_reason): its adversarial certificate cases skipped, allocator check not run"
  if [[ $no_cuvs == 0 ]]; then
    echo "(a run without cuVS fails: pass --no-cuvs to accept it)"
    status=1
  fi
fi
echo "== gpu_check exit status $status"
exit $status
