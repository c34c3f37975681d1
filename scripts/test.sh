#!/usr/bin/env bash
# The whole test suite: checks the tree's format, builds zero (tests included), runs every test with ctest,
# then runs them again built with AddressSanitizer and UndefinedBehaviorSanitizer (scripts/sanitize.sh), runs the
# threaded ones under ThreadSanitizer (scripts/tsan.sh), fuzzes the readers of files and flags for 15 s each
# (scripts/fuzz.sh), and proves the GPU kit complete: the GPU check's build phase, against the kit alone
# (scripts/gpu/), of the programs that load its libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's wall time is printed, so CI's 30-minute budget can be kept by measure.
stage() {
  local start=$SECONDS
  "$@"
  echo "ci: '$*' took $((SECONDS - start)) s"
}
stage bash scripts/install_deps.sh
stage bash scripts/check_format.sh
stage bash scripts/build.sh
# nproc tests at once share the cores: one OpenMP thread per rank (tests of other counts set their own).
OMP_NUM_THREADS=1 stage ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 600
stage bash scripts/sanitize.sh
stage bash scripts/tsan.sh
stage bash scripts/fuzz.sh
stage bash scripts/gpu/kit.sh
# The kit proven by the programs that load each of its libraries (the GPU machine's check builds every target):
# zero-train (Abseil, OpenBLAS), zero-bench (benchmark), and the one-file tcp_store_test for GoogleTest and GMock
# (kernels_test, which it replaces, compiled ten test files more to prove the same). Their kernels as PTX alone: the
# kit is proven without ptxas (attention.cu compiles in 27 s, not 44; the plain build above runs ptxas).
ZERO_GPU_TARGETS="zero-train zero-bench tcp_store_test" ZERO_CUDA_ARCH=90-virtual \
  stage bash scripts/gpu/check.sh build build-gpu/check
