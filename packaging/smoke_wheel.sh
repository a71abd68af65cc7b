#!/usr/bin/env bash
# Install a built wheel into a fresh venv and run a smoke subset of the tests against the installed
# package, the way a user without a compiler gets it (run by .ci/run after packaging/build_wheels.sh cpu):
#
#   bash packaging/smoke_wheel.sh WHEEL [SCRATCH_DIR]
#
# The venv gets torch==2.13.0 (the CPU build), the wheel with its dependencies, pytest and hypothesis
# (tests/test_libgomp.py then loads the installed core with the system's libgomp hidden, on torch's copy);
# for a GPU wheel (dihal_fast_cu12/_cu13) also librmm of the cuVS release ($CUVS_RELEASE, default 26.10),
# so that the route of cuVS's allocations through torch is checked without a GPU (test_cuvs_allocator.py).
# The tests run from a copy of tests/ outside the source tree, with PATH = the venv's bin only (no gcc,
# cc, c++, nvcc or cmake), so neither the source tree nor a compiler can stand in for the wheel. Every
# step, the final import check included, runs the venv's interpreter by its absolute path.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: $0 WHEEL [SCRATCH_DIR]" >&2; exit 2; }
wheel=$(realpath "$1")
[[ -f $wheel && $wheel == *.whl ]] || { echo "not a wheel file: $1" >&2; exit 2; }
smoke=$(realpath "${2:-$(mktemp -d)}")
mkdir -p "$smoke"
[[ ! -e $smoke/venv && ! -e $smoke/tests ]] || { echo "$smoke already has venv/ or tests/: give an empty folder" >&2; exit 2; }

cp -r "$ROOT/tests" "$smoke/tests"
cd "$smoke"  # from here on the repository is not the working directory (python -c would import it from there)
python3 -m venv venv
py=$smoke/venv/bin/python
extra=()
if [[ $(basename "$wheel") =~ ^dihal_fast_(cu1[0-9])- ]]; then extra=("librmm-${BASH_REMATCH[1]}==${CUVS_RELEASE:-26.10}.*"); fi
"$py" -m pip install -q torch==2.13.0 "$wheel" "${extra[@]}" pytest hypothesis 2>&1 | grep -v '^WARNING: Location' || true
"$py" -c "import dihal_fast" || { echo "the wheel did not install into $smoke/venv" >&2; exit 1; }

# A clean environment: the venv's bin as the whole PATH, the repository not on sys.path (importlib
# mode adds no rootdir), no pyproject.toml read (-c /dev/null).
clean=(env -i HOME="$HOME" PATH="$smoke/venv/bin" DIHAL_NUM_THREADS=1)
for tool in gcc cc c++ nvcc cmake; do
  if "${clean[@]}" "$py" -c "import shutil, sys; sys.exit(shutil.which('$tool') is None)"; then
    echo "$tool is on the smoke's PATH: the smoke must run without a compiler" >&2
    exit 1
  fi
done
"${clean[@]}" "$py" -m pytest -q -p no:cacheprovider -c /dev/null --rootdir "$smoke/tests" \
  --import-mode=importlib -W ignore::pytest.PytestUnknownMarkWarning -m "not slow" \
  tests/test_cuda_build.py tests/test_geometry_kernels.py tests/test_cuvs_allocator.py tests/test_libgomp.py \
  tests/test_cuda_stats.py \
  -k "(unavailable or variants_refuse or adversarial or ties or old_bound or certify or knn_matches_reference or allocat or rmm or libgomp or certif or cublas_emulation)"
"${clean[@]}" "$py" -c "
import json, dihal_fast
info = dihal_fast.build_info()
assert '/site-packages/' in dihal_fast.__file__, f'dihal_fast imported from {dihal_fast.__file__}, not the venv'
assert info['backends']['cpu']['available'], info['backends']['cpu']['reason']
print(json.dumps({'version': info['version'], 'distribution': info['distribution'], 'file': dihal_fast.__file__}))
"
