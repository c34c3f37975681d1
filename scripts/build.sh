#!/usr/bin/env bash
# Installs what is missing, then configures and builds zero into build/ (binaries in build/bin/).
# Extra arguments go to cmake, e.g. -DZERO_WITH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
mkdir -p build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >build/configure.log 2>&1 || {
  cat build/configure.log >&2
  exit 1
}
grep -E "^-- zero:" build/configure.log || true
ninja -C build -j "$(nproc)"
