#!/usr/bin/env bash
# The threaded tests under ThreadSanitizer: the communicators, the CPU streams, the simulated device, the engine and
# the models on the engine, built with -fsanitize=thread into build-tsan/ (CUDA and MPI off) against an Abseil
# compiled with the same flags (scripts/abseil_source.sh). One OpenMP thread per rank: GCC's OpenMP runtime is not
# instrumented, so its barriers would look like races. Any data race, lock-order inversion or thread leak fails
# the test that hit it.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
bash scripts/abseil_source.sh build-tsan/abseil
targets=(runtime_test comm_local_test tcp_store_test sim_device_test device_api_test engine_test models_engine_test)
# Deprecations off: this Abseil is newer than Debian's, whose MutexLock(Mutex*) zero uses, and deprecates it.
flags="-fsanitize=thread -fno-omit-frame-pointer -Wno-deprecated-declarations"
# -O1 -g1, as for AddressSanitizer (scripts/asan_build.sh): ThreadSanitizer asks for -O1 or more, and line tables are
# all its reports print. Against -O3 -g, engine_test.cc compiles in 14 s, not 35.
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DZERO_WITH_CUDA=OFF -DZERO_WITH_MPI=OFF -DZERO_WITH_NCCL=OFF -DZERO_BUILD_BENCHMARKS=OFF \
  "-DZERO_ABSEIL_SOURCE_DIR=$PWD/build-tsan/abseil" \
  "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$flags" >build-tsan/configure.log 2>&1 || {
  cat build-tsan/configure.log >&2
  exit 1
}
ninja -C build-tsan -j "$(nproc)" "${targets[@]}"

export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
labels="^($(IFS='|'; echo "${targets[*]}"))$"
OMP_NUM_THREADS=1 ctest --test-dir build-tsan --output-on-failure -j "$(nproc)" --timeout 600 -L "$labels"
