#!/usr/bin/env bash
# The prepared GPU check of the CUDA backend, within one 540 s budget on one H100/H200 (each step has its own
# deadline, cut to what is left of the budget; a step that no longer fits is NOT RUN and fails the check):
#   0. torch must see a CUDA device (else it stops at once, saying so),
#   1. build the package with DIHAL_CUDA=ON for this GPU's architecture only (in place, editable, with the
#      machine's torch),
#   then in priority order:
#   2. kernel smoke: every kernel once against the reference, and the kNN kernel (cuda, and cuvs where it
#      runs) must itself certify >= 99 % of ordinary rows, each equal to the reference (tools/gpu_first_run.py
#      smoke; the float64 / exact fallbacks would otherwise hide a broken kernel),
#   3. the adversarial kNN certificate families on cuda and cuvs (once, with torch's TF32 flags on: the
#      private cuBLAS handles compute in PEDANTIC mode, which those flags never reach),
#   4. multi-tile kNN, covariance and local eigenvalues on three side streams from three threads at once
#      vs the reference under compute-sanitizer memcheck, with torch's caching allocator off
#      (PYTORCH_NO_CUDA_MEMORY_CACHING=1, so an overrun past a tensor is not hidden inside a cached block),
#   5. the large-index smoke, n * D > 2^31 bfloat16 rows: kNN and covariance (tools/gpu_first_run.py large),
#   6. the `-m gpu` tests with skips turned into failures (DIHAL_REQUIRE_GPU=1; the CPU grid is not re-run),
#   7. the device guard (tools/gpu_first_run.py guard) and, where cuVS runs, cuVS through torch's allocator
#      (tests/test_cuvs_allocator.py),
#   8. with --full only, after the budget: every kernel timed (bench/bench_gpu.py) and a locate profile.
# The records (figures, command, commit, machine) go to bench/results/; the log and those records are also
# copied to $OUT when it is set (the device tool brings that folder back). The log ends with a summary: one
# line per step (ok / FAILED (exit N) / FAILED (deadline of N s) / NOT RUN), the total seconds, and
# "NOT RUN: cuvs (reason)" when cuVS cannot run after the build (not compiled in, libcuvs / librmm not
# installed, or get_backend("cuvs") refused). A run without cuVS exits non-zero unless --no-cuvs says that
# is intended; with cuVS usable, skips of the cuvs cases become failures (DIHAL_REQUIRE_CUVS=1).
#
#   bash bench/gpu_check.sh                 # on the GPU machine
#   bash bench/gpu_check.sh --full          # plus step 8
#   bash bench/gpu_check.sh --no-cuvs       # accept a run without cuVS (exit 0 when the rest passes)
#   bash bench/gpu_check.sh --fetch-wheels  # on a networked machine: wheels the GPU image lacks -> .whl/
#   bash bench/gpu_check.sh --help          # this text
#
# A GPU machine without network gets missing Python packages from .whl/ (carried along; see
# --fetch-wheels), installed into /tmp/site and put on PYTHONPATH. With this workplace's device
# tool: `bash bench/gpu_check.sh --fetch-wheels` here, then run `bash bench/gpu_check.sh` there
# with carry [".whl"] and a timeout of 600 s; copy $OUT/results/*.json back into bench/results/ and
# run `python bench/render_results.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEEL_PY=${WHEEL_PY:-3.12}
NEEDED="scipy-openblas32 nvtx"
BUDGET=${GPU_CHECK_BUDGET:-540}  # seconds for steps 0-7 together

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
echo "== $(date -u +%FT%TZ) gpu_check on $(hostname), budget $BUDGET s"
t_start=$(date +%s)
status=0
summary=()
step() {  # step SECONDS NAME COMMAND...: one check under its deadline (cut to the budget left); keep going
  local limit=$1 name=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - t_start) ))
  if (( left < 10 )); then
    echo "== NOT RUN: $name (the $BUDGET s budget is spent)"
    summary+=("NOT RUN: $name (the $BUDGET s budget is spent)"); status=1; return 0
  fi
  (( limit > left )) && limit=$left
  echo "== $name (deadline $limit s)"
  local t0 rc=0; t0=$(date +%s)
  timeout "$limit" "$@" || rc=$?
  local took=$(( $(date +%s) - t0 ))
  echo "$name seconds: $took"
  if [[ $rc == 0 ]]; then summary+=("ok: $name (${took} s)")
  elif [[ $rc == 124 ]]; then echo "FAILED (deadline of $limit s): $name"; summary+=("FAILED (deadline of $limit s): $name"); status=1
  else echo "FAILED (exit $rc): $name"; summary+=("FAILED (exit $rc): $name (${took} s)"); status=1; fi
}
finish() {
  if [[ -n "${OUT:-}" ]]; then mkdir -p "$OUT/results" && cp bench/results/*.json "$OUT/results/" 2>/dev/null || true; fi
  echo "== summary"
  printf '%s\n' "${summary[@]}"
  echo "total seconds: $(( $(date +%s) - t_start )) (budget $BUDGET)"
}

if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
for mod in torch scipy_openblas32 nvtx scikit_build_core pybind11 pytest hypothesis transformers; do
  "$PY" -c "import $mod" 2>/dev/null || { echo "missing Python package: $mod (see --fetch-wheels)"; exit 1; }
done

# 0. torch must see the GPU: without it every later step would only skip.
step 30 "torch sees a CUDA device" "$PY" -c "
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f'torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device')
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))"
if [[ $status != 0 ]]; then echo "no usable GPU: nothing else can be checked"; finish; exit 1; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

# 1. this GPU's architecture only (SASS and PTX of it): the fastest build that runs here.
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d '. ')
[[ $ARCH =~ ^[0-9]+$ ]] || { echo "nvidia-smi gave no compute capability ('$ARCH')"; finish; exit 1; }
step 170 "build (DIHAL_CUDA=ON, sm_$ARCH)" env DIHAL_CUDA=ON "$PY" -m pip install -q --no-build-isolation --no-deps -e . \
  -Ccmake.define.DIHAL_CUDA_ARCHITECTURES="$ARCH"
if [[ $status != 0 ]]; then echo "the build failed: nothing else can be checked"; finish; exit 1; fi
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

step 40 "kernel smoke with the certified-share check" env "${require_cuvs[@]}" "$PY" tools/gpu_first_run.py smoke
step 50 "adversarial kNN certificate (cuda, cuvs)" env "${require_cuvs[@]}" DIHAL_TEST_TF32=1 DIHAL_REQUIRE_GPU=1 \
  "$PY" -m pytest -rs -q -p no:cacheprovider tests/test_geometry_kernels.py -k "adversarial and (cuda- or cuvs-)"
SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
step 90 "side streams (kNN, covariance, local eigen) under compute-sanitizer memcheck, torch's cache off" \
  env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SANITIZER" --tool memcheck --error-exitcode 3 "$PY" tools/gpu_first_run.py streams
step 60 "large-index smoke (bfloat16, n * D > 2^31)" "$PY" tools/gpu_first_run.py large
step 70 "-m gpu tests" env "${require_cuvs[@]}" DIHAL_REQUIRE_GPU=1 "$PY" -m pytest -q -rs -p no:cacheprovider -m gpu \
  tests/test_geometry_kernels.py tests/test_geometry_api.py tests/test_cuda_build.py tests/test_cuda_stats.py \
  tests/test_profiling.py
step 20 "device guard (no context created on an unused device)" "$PY" tools/gpu_first_run.py guard
if [[ -z $cuvs_reason ]]; then
  step 20 "cuVS through torch's allocator" env DIHAL_REQUIRE_GPU=1 "$PY" -m pytest -q -s -rs -p no:cacheprovider \
    tests/test_cuvs_allocator.py
fi

if [[ $full == 1 ]]; then
  BUDGET=$(( BUDGET + 500 ))  # the timings come after the check's own budget
  step 300 "kernel timings" "$PY" bench/bench_gpu.py
  step 200 "locate profile" "$PY" bench/profile_locate.py --max-tokens 16384 --repeats 3 --sample-size 2000
fi

finish
if [[ -n $cuvs_reason ]]; then
  echo "NOT RUN: cuvs ($cuvs_reason): its adversarial certificate cases skipped, allocator check not run"
  if [[ $no_cuvs == 0 ]]; then
    echo "(a run without cuVS fails: pass --no-cuvs to accept it)"
    status=1
  fi
fi
echo "== gpu_check exit status $status"
exit $status
