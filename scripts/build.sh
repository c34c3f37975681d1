#!/usr/bin/env bash
# Installs what is missing, then configures and builds zero into build/ (binaries in build/bin/).
# Extra arguments go to cmake, e.g. -DZERO_WITH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
mkdir -p build
# Beside a CUDA toolkit, cudnn-frontend's headers for cuDNN's fused attention (fetched once; ZERO_WITH_CUDNN).
frontend=()
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  bash scripts/cudnn_frontend.sh build/cudnn-frontend
  frontend=("-DCUDNN_FRONTEND_ROOT=$PWD/build/cudnn-frontend")
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${frontend[@]}" "$@" >build/configure.log 2>&1 || {
  cat build/configure.log >&2
  exit 1
}
grep -E "^-- zero:" build/configure.log || true
ninja -C build -j "$(nproc)"
