#!/usr/bin/env bash
# The whole test suite: checks the tree's format, builds zero (tests included), runs every test with ctest,
# then runs them again built with AddressSanitizer and UndefinedBehaviorSanitizer (scripts/sanitize.sh), runs the
# threaded ones under ThreadSanitizer (scripts/tsan.sh), fuzzes the readers of files and flags for 30 s each
# (scripts/fuzz.sh), and proves the GPU kit complete: the GPU check's build phase, against the kit alone
# (scripts/gpu/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/check_format.sh
bash scripts/build.sh
# nproc tests at once share the cores: one OpenMP thread per rank (tests of other counts set their own).
OMP_NUM_THREADS=1 ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 600
bash scripts/sanitize.sh
bash scripts/tsan.sh
bash scripts/fuzz.sh
bash scripts/gpu/kit.sh
bash scripts/gpu/check.sh build build-gpu/check
