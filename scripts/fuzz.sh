#!/usr/bin/env bash
# Fuzzes what reads files and flags: builds tests/fuzz with clang, AddressSanitizer and UndefinedBehaviorSanitizer
# into build-fuzz/ (CUDA and MPI off), then runs each target, a core each, for FUZZ_SECONDS (default 15) over its committed
# corpus (tests/fuzz/corpus/<target>/, read only; new inputs go to build-fuzz/corpus/). A crash, a leak, a
# sanitizer report or an input slower than 10 s fails it, and the input is saved in build-fuzz/ as
# <target>-crash-... (or -leak-, -timeout-) to reproduce: build-fuzz/bin/<target> <input>
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
targets=(fuzz_train_config fuzz_safetensors fuzz_checkpoint fuzz_token_shard)
# -Wno-pass-failed: under the sanitizers' instrumentation clang cannot vectorize the `omp simd` loops, and says so.
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g"
flags+=" -Wno-pass-failed"
mkdir -p build-fuzz
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZERO_BUILD_FUZZERS=ON \
  -DZERO_WITH_CUDA=OFF -DZERO_WITH_MPI=OFF -DZERO_WITH_NCCL=OFF -DZERO_BUILD_BENCHMARKS=OFF \
  "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" \
  >build-fuzz/configure.log 2>&1 || {
  cat build-fuzz/configure.log >&2
  exit 1
}
ninja -C build-fuzz -j "$(nproc)" "${targets[@]}"

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# One target: its log, then its stats; on a failure the log's tail and a non-zero exit.
fuzz_target() {
  local target=$1
  mkdir -p "build-fuzz/corpus/$target"
  if ! (cd build-fuzz && "bin/$target" -max_total_time="${FUZZ_SECONDS:-15}" -timeout=10 -rss_limit_mb=4096 \
    -artifact_prefix="$target-" -print_final_stats=1 "corpus/$target" "../tests/fuzz/corpus/$target" \
    >"$target.log" 2>&1); then
    tail -n 60 "build-fuzz/$target.log" | sed "s/^/$target: /"  # prefixed: the other targets print meanwhile
    echo "fuzz: $target failed (log build-fuzz/$target.log)" >&2
    return 1
  fi
  echo "fuzz: $target for ${FUZZ_SECONDS:-15} s: $(grep -E "^stat::(number_of_executed_units|new_units_added)" \
    "build-fuzz/$target.log" | tr -s ' \n' ' ')"
}
export -f fuzz_target
# A core each (libFuzzer runs one process): nproc targets at once, each still fuzzed for its full time.
printf '%s\n' "${targets[@]}" | xargs -P "$(nproc)" -I{} bash -c 'fuzz_target "$1"' _ {}
