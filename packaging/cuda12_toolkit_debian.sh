#!/usr/bin/env bash
# A CUDA 12 toolkit for building the cu12 wheel on a Debian/Ubuntu x86_64 machine without NVIDIA's
# repository: PyPI has no CUDA 12 compiler (every nvidia-cuda-nvcc-cu12 release, 12.0.140 to 12.9.86,
# ships ptxas only, no nvcc driver, cudafe++ or fatbinary), but Debian 13 (trixie, non-free) packages
# CUDA 12.4.1. This downloads those packages with a private apt configuration (nothing is installed,
# no system apt source is changed), unpacks them into PREFIX and lays them out as NVIDIA's installer
# does (bin/nvcc + nvcc.profile, nvvm/, targets/x86_64-linux/{include,lib}), so that CMake finds it:
#
#   bash packaging/cuda12_toolkit_debian.sh PREFIX       # about 1 GB download, 2.7 GB unpacked
#   PATH=PREFIX/bin:$PATH CUDAToolkit_ROOT=PREFIX bash packaging/build_wheels.sh cu12
#
# CUDA 12.4 compiles for sm_80 and sm_90 (not sm_100 / sm_120, which need 12.8) with the host gcc <= 13.
# The cibuildwheel container installs CUDA 12.8 from NVIDIA's rpm repository instead
# (csrc/cuda/install_cuda_toolkit.sh).
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 PREFIX" >&2; exit 2; }
prefix=$(realpath -m "$1")
[[ ! -e $prefix/bin/nvcc ]] || { echo "$prefix/bin/nvcc exists already" >&2; exit 1; }
packages=(nvidia-cuda-toolkit nvidia-cuda-dev libnvvm4 libcu++-dev libcub-dev libthrust-dev)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs" "$prefix"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main contrib non-free" \
  > "$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o APT::Architecture=amd64)
apt-get "${apt_opts[@]}" -qq update
(cd "$work/debs" && apt-get "${apt_opts[@]}" -qq download "${packages[@]}")
raw=$prefix/debian
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$raw"; done

# NVIDIA's layout over Debian's files (Debian: /usr/bin, /usr/include, /usr/lib/x86_64-linux-gnu,
# /usr/lib/nvidia-cuda-toolkit/{bin,libdevice}; its nvcc.profile points at /usr and is not used).
mkdir -p "$prefix/bin" "$prefix/nvvm/bin" "$prefix/targets/x86_64-linux"
cp "$raw/usr/lib/nvidia-cuda-toolkit/bin/nvcc" "$prefix/bin/nvcc"  # a copy: nvcc reads nvcc.profile beside itself
cp -r "$raw/usr/lib/nvidia-cuda-toolkit/bin/crt" "$prefix/bin/crt"
for tool in "$raw"/usr/bin/*; do
  [[ $(basename "$tool") == nvcc ]] || ln -sfn "$tool" "$prefix/bin/$(basename "$tool")"
done
ln -sfn "$raw/usr/lib/nvidia-cuda-toolkit/bin/cicc" "$prefix/nvvm/bin/cicc"
ln -sfn "$raw/usr/lib/nvidia-cuda-toolkit/libdevice" "$prefix/nvvm/libdevice"
ln -sfn "$raw/usr/include" "$prefix/targets/x86_64-linux/include"
ln -sfn "$raw/usr/lib/x86_64-linux-gnu" "$prefix/targets/x86_64-linux/lib"
ln -sfn targets/x86_64-linux/include "$prefix/include"
ln -sfn targets/x86_64-linux/lib "$prefix/lib64"
cat > "$prefix/bin/nvcc.profile" << 'EOF'
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/$(_TARGET_DIR_)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/$(_TARGET_DIR_)/lib/stubs" "-L$(TOP)/$(_TARGET_DIR_)/lib"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
EOF
"$prefix/bin/nvcc" --version | tail -n 2
