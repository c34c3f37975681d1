#!/usr/bin/env bash
# Packs what the GPU machine's image lacks into .gpu-kit/ (git-ignored, carried with the working tree):
# the files of this machine's installed Debian packages for Abseil, GoogleTest, benchmark, OpenBLAS,
# nlohmann-json and xxHash, under usr/ as Debian lays them out, and cudnn-frontend's headers, in one xz archive that
# scripts/gpu/check.sh unpacks there. The image itself brings CUDA, cuDNN, NCCL, CMake, ninja and g++.
#
# usage: scripts/gpu/kit.sh        (installs the packages first if missing; ~1 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."

packages=(
  libabsl-dev libabsl20220623
  libgtest-dev libgmock-dev
  libbenchmark-dev libbenchmark1debian
  libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0
  nlohmann-json3-dev libxxhash-dev
)
# What the build never reads: documentation, sources, pkg-config files, Debian's OpenBLAS config (absolute
# paths; a relocatable one is written below), static copies of shared libraries, and LAPACK.
skip='^/usr/share/(doc|man|lintian|bug)/|^/usr/src/|/pkgconfig/|/openblas-pthread/cmake/|/libabsl_[a-z0-9_]+\.a$|/openblas-pthread/lib(openblasp-r[0-9.]+|openblas|blas|lapack)\.a$|/lib(blas|lapack)\.so'
limit_mib=38  # with the working tree (~2 MiB), under the device's 40 MiB carry budget

bash scripts/install_deps.sh
kit=.gpu-kit
stage="$kit/stage"
rm -rf "$kit" && mkdir -p "$stage"

for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || {
    echo "kit.sh: package $p is not installed; apt-get install $p" >&2
    exit 1
  }
  # Regular files and the packages' own relative links (sonames); absolute links point into
  # /etc/alternatives and are replaced below.
  dpkg -L "$p" | grep -Ev "$skip" | while read -r f; do
    if [ -f "$f" ] && [ ! -L "$f" ] || { [ -L "$f" ] && [[ "$(readlink "$f")" != /* ]]; }; then
      cp -P --parents "$f" "$stage"
    fi
  done
  dpkg-query -W -f='${Package} ${Version}\n' "$p" >>"$kit/MANIFEST"
done

# cudnn-frontend's headers (PyPI, scripts/cudnn_frontend.sh) where the build looks for them: the kit's include/.
bash scripts/cudnn_frontend.sh build/cudnn-frontend
mkdir -p "$stage/usr/include" && cp -r build/cudnn-frontend/include/. "$stage/usr/include/"
echo "nvidia-cudnn-frontend $(sed -n 's/^version=//p' scripts/cudnn_frontend.sh)" >>"$kit/MANIFEST"

# OpenBLAS's Debian config names absolute /usr paths: a relocatable one where find_package looks.
blas_dir=usr/lib/x86_64-linux-gnu/cmake/openblas
mkdir -p "$stage/$blas_dir"
cat >"$stage/$blas_dir/OpenBLASConfig.cmake" <<'CMAKE'
# OpenBLAS 0.3.21 (Debian's pthread build), relative to this file: the zero GPU kit.
get_filename_component(_openblas_usr "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)
set(OpenBLAS_VERSION 0.3.21)
set(OpenBLAS_INCLUDE_DIRS "${_openblas_usr}/include/x86_64-linux-gnu/openblas-pthread")
set(OpenBLAS_LIBRARIES "${_openblas_usr}/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so")
CMAKE

tar -C "$stage" -cf - usr | xz -T0 -6 >"$kit/deps.tar.xz"
# The tree it was packed beside, so a GPU report names what it ran.
echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes')" \
  >"$kit/REV"
rm -rf "$stage"
size=$(du -m "$kit/deps.tar.xz" | cut -f1)
echo "kit.sh: $kit/deps.tar.xz is ${size} MiB ($(wc -l <"$kit/MANIFEST") packages, listed in $kit/MANIFEST)"
if [ "$size" -gt "$limit_mib" ]; then
  echo "kit.sh: the kit exceeds ${limit_mib} MiB; the device carries at most 40 MiB with the tree" >&2
  exit 1
fi
