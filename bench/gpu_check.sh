#!/usr/bin/env bash
# The prepared GPU check of the CUDA backend (a few minutes on an H100/H200):
#   1. build the package with DIHAL_CUDA=ON (in place, editable, with the machine's torch),
#   2. run the CUDA tests with skips turned into failures (DIHAL_REQUIRE_GPU=1),
#   3. time every kernel against its floor, torch and cuVS (bench/bench_gpu.py),
#   4. profile a small locate pass (bench/profile_locate.py),
# writing their records (figures, command, commit, machine) to bench/results/. The log and those records
# are also copied to $OUT when it is set (the device tool brings that folder back).
#
#   bash bench/gpu_check.sh                 # on the GPU machine
#   bash bench/gpu_check.sh --fetch-wheels  # on a networked machine: wheels the GPU image lacks -> .whl/
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

if [[ "${1:-}" == "--fetch-wheels" ]]; then
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

echo "== build (DIHAL_CUDA=ON)"
start=$(date +%s)
DIHAL_CUDA=ON "$PY" -m pip install --no-build-isolation --no-deps -e . 2>&1 | tail -n 3
echo "build seconds: $(( $(date +%s) - start ))"
"$PY" -c "import dihal_fast, json; print(json.dumps(dihal_fast.build_info()['backends'], indent=1))"

echo "== CUDA tests"
status=0
DIHAL_REQUIRE_GPU=1 "$PY" -m pytest -q -p no:cacheprovider tests/test_geometry_kernels.py tests/test_cuda_build.py tests/test_profiling.py || status=$?

echo "== kernel timings"
"$PY" bench/bench_gpu.py || status=$?

echo "== locate profile"
"$PY" bench/profile_locate.py --max-tokens 16384 --repeats 3 --sample-size 2000 || status=$?

if [[ -n "${OUT:-}" ]]; then mkdir -p "$OUT/results" && cp bench/results/*.json "$OUT/results/"; fi
echo "== gpu_check exit status $status"
exit $status
