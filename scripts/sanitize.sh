#!/usr/bin/env bash
# The suite under AddressSanitizer and UndefinedBehaviorSanitizer: a CPU build (CUDA off) into build-asan/,
# then every test but two: the install test (a consumer built without the sanitizers cannot link their libraries)
# and models_engine_test_sim_delays (the same tests again with random stream delays, which probe the simulated
# device's ordering checks, not memory; it runs in the plain build, and here it would take 90 s of one core).
# Open MPI's own leaks and LeakSanitizer's own thread-start race are suppressed (tests/sanitizers/lsan.supp);
# any other leak, overflow, use after free or undefined behaviour fails the test that hit it.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
mkdir -p build-asan
# -O1, as AddressSanitizer's own documentation advises: a third less compile time than -O2 (zero_train_test.cc:
# 21 s against 30 s), for tests that run somewhat slower. -g1: line tables alone, enough for the reports' file:line,
# and a quarter less compile time than -g.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DZERO_WITH_CUDA=OFF -DZERO_WITH_NCCL=OFF -DZERO_BUILD_BENCHMARKS=OFF \
  "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$flags" "-DCMAKE_SHARED_LINKER_FLAGS=$flags" \
  >build-asan/configure.log 2>&1 || {
  cat build-asan/configure.log >&2
  exit 1
}
ninja -C build-asan -j "$(nproc)"

# Open MPI unloads its components before the leak check: keep them loaded, and unwind fully, so its
# allocations are recognised by their library.
export OMPI_MCA_mca_base_component_disable_dlclose=1
export ASAN_OPTIONS=fast_unwind_on_malloc=0
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
OMP_NUM_THREADS=1 ctest --test-dir build-asan --output-on-failure -j "$(nproc)" --timeout 600 -E '^(install_and_find_package|models_engine_test_sim_delays)$'
