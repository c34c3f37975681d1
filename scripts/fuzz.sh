#!/usr/bin/env bash
# Fuzzes what reads files and flags: builds tests/fuzz in the sanitizer build (scripts/asan_build.sh: clang,
# AddressSanitizer, UndefinedBehaviorSanitizer, build-asan/), then runs each target, a core each, for FUZZ_SECONDS
# (default 15) over its committed corpus (tests/fuzz/corpus/<target>/, read only; new inputs go to build-asan/corpus/).
# A crash, a leak, a sanitizer report or an input slower than 10 s fails it, and the input is saved in build-asan/ as
# <target>-crash-... (or -leak-, -timeout-) to reproduce: build-asan/bin/<target> <input>
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(fuzz_train_config fuzz_safetensors fuzz_checkpoint fuzz_token_shard)
bash scripts/asan_build.sh "${targets[@]}"

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# One target: its log, then its stats; on a failure the log's tail and a non-zero exit.
fuzz_target() {
  local target=$1
  mkdir -p "build-asan/corpus/$target"
  if ! (cd build-asan && "bin/$target" -max_total_time="${FUZZ_SECONDS:-15}" -timeout=10 -rss_limit_mb=4096 \
    -artifact_prefix="$target-" -print_final_stats=1 "corpus/$target" "../tests/fuzz/corpus/$target" \
    >"$target.log" 2>&1); then
    tail -n 60 "build-asan/$target.log" | sed "s/^/$target: /"  # prefixed: the other targets print meanwhile
    echo "fuzz: $target failed (log build-asan/$target.log)" >&2
    return 1
  fi
  echo "fuzz: $target for ${FUZZ_SECONDS:-15} s: $(grep -E "^stat::(number_of_executed_units|new_units_added)" \
    "build-asan/$target.log" | tr -s ' \n' ' ')"
}
export -f fuzz_target
# A core each (libFuzzer runs one process): nproc targets at once, each still fuzzed for its full time.
printf '%s\n' "${targets[@]}" | xargs -P "$(nproc)" -I{} bash -c 'fuzz_target "$1"' _ {}
