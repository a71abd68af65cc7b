#!/usr/bin/env bash
# cibuildwheel before-all for the CUDA wheel variants (manylinux_2_28, AlmaLinux 8): installs the
# CUDA compiler, static runtime, NVTX3 and cuBLAS headers of DIHAL_WHEEL_VARIANT (cu12 -> 12.8,
# cu13 -> 13.0) from NVIDIA's rhel8 repository, whose .repo file URL the CI job passes as
# CUDA_RPM_REPO. The cpu variant installs nothing.
set -euo pipefail
case "${DIHAL_WHEEL_VARIANT:-cpu}" in
  cpu) exit 0 ;;
  cu12) version=12-8 ;;
  cu13) version=13-0 ;;
  *) echo "DIHAL_WHEEL_VARIANT must be cpu, cu12 or cu13, got '${DIHAL_WHEEL_VARIANT}'" >&2; exit 1 ;;
esac
if [[ -z "${CUDA_RPM_REPO:-}" ]]; then
  echo "CUDA_RPM_REPO is not set: give the URL of NVIDIA's CUDA .repo file for rhel8/x86_64" >&2
  exit 1
fi
dnf install -y dnf-plugins-core
dnf config-manager --add-repo "$CUDA_RPM_REPO"
dnf install -y "cuda-nvcc-$version" "cuda-cudart-devel-$version" "cuda-nvtx-$version" "libcublas-devel-$version"
ln -sfn "/usr/local/cuda-${version/-/.}" /usr/local/cuda
/usr/local/cuda/bin/nvcc --version
