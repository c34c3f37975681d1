#!/usr/bin/env bash
# The suite under AddressSanitizer and UndefinedBehaviorSanitizer: the sanitizer build (scripts/asan_build.sh), then
# every test but two: the install test (a consumer built without the sanitizers cannot link their libraries) and
# models_engine_test_sim_delays (the same tests again with random stream delays, which probe the simulated device's
# ordering checks, not memory; it runs in the plain build, and here it would take 90 s of one core).
# Open MPI's own leaks and LeakSanitizer's own thread-start race are suppressed (tests/sanitizers/lsan.supp);
# any other leak, overflow, use after free or undefined behaviour fails the test that hit it.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/asan_build.sh

# Open MPI unloads its components before the leak check: keep them loaded, and unwind fully, so its
# allocations are recognised by their library.
export OMPI_MCA_mca_base_component_disable_dlclose=1
export ASAN_OPTIONS=fast_unwind_on_malloc=0
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
OMP_NUM_THREADS=1 ctest --test-dir build-asan --output-on-failure -j "$(nproc)" --timeout 600 -E '^(install_and_find_package|models_engine_test_sim_delays)$'
