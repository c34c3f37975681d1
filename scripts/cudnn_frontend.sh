#!/usr/bin/env bash
# Fetches cudnn-frontend's headers (NVIDIA's C++ graph API over cuDNN, header-only) into the folder given ($1), for the
# cuDNN fused attention (kernels/cuda/cudnn_attention.cc): the include/ of the nvidia-cudnn-frontend wheel on PyPI,
# pinned by version and SHA-256. Does nothing when present.
set -euo pipefail
dest=$1
[ -f "$dest/include/cudnn_frontend.h" ] && exit 0

version=1.32.0
wheel=nvidia_cudnn_frontend-$version-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
download="$dest.download"
rm -rf "$download" "$dest.partial" && mkdir -p "$download" "$dest.partial"
echo "cudnn_frontend: fetching cudnn-frontend $version's headers from PyPI" >&2
echo "nvidia-cudnn-frontend==$version --hash=sha256:$sha256" >"$download/requirements.txt"
# The headers are the same in every wheel of a version: this one is fetched whatever Python runs pip.
python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 -r "$download/requirements.txt" -d "$download" || {
  echo "cudnn_frontend: could not fetch $wheel with SHA-256 $sha256 from PyPI" >&2
  exit 1
}
python3 -c 'import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as w:
    w.extractall(sys.argv[2], [n for n in w.namelist() if n.startswith("include/")])' "$download/$wheel" "$dest.partial"
rm -rf "$dest" && mv "$dest.partial" "$dest" && rm -rf "$download"
