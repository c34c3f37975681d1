#!/usr/bin/env bash
# The sanitizer build, shared by the suite (scripts/sanitize.sh) and the fuzzers (scripts/fuzz.sh): zero compiled by
# clang with AddressSanitizer, UndefinedBehaviorSanitizer and libFuzzer's coverage into build-asan/ (CUDA off, the
# libFuzzer targets in), then the targets given built (all when none). One build for both: the fuzzers need their
# libraries instrumented for coverage, the tests tolerate it, and a second build of every library would cost CI
# four minutes on 2 cores. clang, not g++: its UndefinedBehaviorSanitizer also checks pointer arithmetic on null,
# and it built this tree in 558 s where g++ took 760 (2 cores; the suite then runs slower under the coverage).
#
# usage: scripts/asan_build.sh [ninja targets...]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
link_flags="-fsanitize=address,undefined"  # the fuzzers add -fsanitize=fuzzer (tests/fuzz), the tests link none
mkdir -p build-asan
# A cache another compiler made (g++ built build-asan/ before): CMake would reset it and drop the flags below.
grep -qs '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++' build-asan/CMakeCache.txt || rm -rf build-asan/CMakeCache.txt build-asan/CMakeFiles
# -O1, as AddressSanitizer's own documentation advises, for a third less compile time than -O2; -g1: line tables
# alone, enough for the reports' file:line. -Wno-pass-failed: under the instrumentation clang cannot vectorize the
# `omp simd` loops, and says so.
cmake -S . -B build-asan -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DZERO_WITH_CUDA=OFF -DZERO_WITH_NCCL=OFF -DZERO_BUILD_BENCHMARKS=OFF -DZERO_BUILD_FUZZERS=ON \
  "-DCMAKE_CXX_FLAGS=$flags -Wno-pass-failed" "-DCMAKE_EXE_LINKER_FLAGS=$link_flags" \
  "-DCMAKE_SHARED_LINKER_FLAGS=$link_flags" >build-asan/configure.log 2>&1 || {
  cat build-asan/configure.log >&2
  exit 1
}
ninja -C build-asan -j "$(nproc)" "$@"
