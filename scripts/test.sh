#!/usr/bin/env bash
# The whole test suite: checks the tree's format, builds zero (tests included), then runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/check_format.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 600
