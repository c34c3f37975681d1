#!/usr/bin/env bash
# Installs the Debian packages zero builds against; does nothing when all are present.
set -euo pipefail

packages=(
  cmake ninja-build g++
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libxxhash-dev gnuplot-nox python3 python3-venv xz-utils
  clang-format-14 clang libclang-rt-14-dev libomp-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install_deps: installing ${missing[*]}" >&2
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
