#!/usr/bin/env bash
# The GPU check, one phase per command, on a bare GPU machine (CUDA, NCCL and PyTorch from its image, the rest
# from the kit that scripts/gpu/kit.sh packs here). Each phase writes OUT/<phase>.txt and fails loudly.
#
# usage: scripts/gpu/check.sh build|test|sanitize|train|bench|stages|profile OUT
#   build  configure and build build-gpu/ against the kit alone (system prefixes ignored), sm_90, CUDA and NCCL on
#   test   every test, GPU tests required (a GPU test that skips fails)
#   sanitize  compute-sanitizer memcheck over the CUDA kernel, device API and optimizer tests, racecheck over the
#          first two (cuDNN's attention and cuBLAS's own kernels left out); every run made, the phase failing after
#   train  the main job on the GPU (4 local ranks sharing it, also with the optimizer offloaded to the host; the
#          nccl backend, one rank) and on the CPU; losses compared; the CPU run's export loaded by transformers'
#          from_pretrained
#   bench  GPT-2 124M, bf16, sequence 1024, batches 8 and 64: zero (its attention through cuDNN; at the first
#          batch through its tiled kernels too) against PyTorch (eager and torch.compile) on the same GPU, with MFU
#   stages zero-bench stages (GPT-2 124M, 4 local ranks sharing the GPU) and comm on the GPU
#   profile  where the bench's step spends its GPU time: ncu's kernel durations, ranked
# Every command has a time limit, so each phase ends inside 9 minutes (the device's 10 per command).
# Environment: ZERO_CUDA_ARCH (default 90), NCCL_ROOT (default: the nvidia-nccl wheel's folder, else the
# toolkit's), CUDNN_ROOT (likewise, the nvidia-cudnn wheel's), ZERO_GPU_BATCH (bench: the batches, sequences per
# step, default "8 64"; profile: the first), ZERO_GPU_TARGETS (build: the targets, default all).
set -eEuo pipefail  # -E: the ERR trap below fires inside the phase functions too
cd "$(dirname "$0")/../.."

usage="usage: scripts/gpu/check.sh build|test|sanitize|train|bench|stages|profile OUT"
phase=${1:?$usage}
out=${2:?$usage}
mkdir -p "$out"
out=$(cd "$out" && pwd)
report="$out/$phase.txt"
build=build-gpu
# The kit unpacks into the build folder, so it lives and goes with it: a call that carries .gpu-kit replaces
# that folder with the 7 MiB archive alone, and a machine given back takes both.
prefix=$PWD/$build/kit/usr
lib=$prefix/lib/x86_64-linux-gnu

# A library's root: the environment's, else the folder of its NVIDIA wheel (nvidia.nccl, nvidia.cudnn), else none.
wheel_root() {
  [ -n "${!1:-}" ] && { echo "${!1}"; return; }
  python3 -c "import nvidia.$2 as m; print(list(m.__path__)[0])" 2>/dev/null || true
}
nccl_root() { wheel_root NCCL_ROOT nccl; }
cudnn_root() { wheel_root CUDNN_ROOT cudnn; }

unpack_kit() {
  [ -f .gpu-kit/deps.tar.xz ] || {
    echo "no .gpu-kit/deps.tar.xz: run scripts/gpu/kit.sh on the build machine and carry .gpu-kit" >&2
    return 1
  }
  [ -d "$prefix" ] && [ "$prefix" -nt .gpu-kit/deps.tar.xz ] && return 0
  rm -rf "$build/kit" && mkdir -p "$build/kit"
  if command -v xz >/dev/null; then
    tar -C "$build/kit" -xJf .gpu-kit/deps.tar.xz
  else  # an image without xz-utils: Python's tarfile reads xz itself
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' .gpu-kit/deps.tar.xz "$build/kit"
  fi
  touch "$prefix"
}

# Every phase: the kit unpacked, and its shared libraries and NCCL's on the loader's path for every program
# started (RUNPATH covers a binary's direct libraries only: Abseil's own and OpenBLAS's gfortran come from here,
# also for the test discovery that runs inside the build).
phase_env() {
  unpack_kit
  command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
  local nccl cudnn toolkit
  nccl=$(nccl_root)
  cudnn=$(cudnn_root)
  # The toolkit's libraries too: cuDNN's runtime-compiled engines dlopen NVRTC, which no RUNPATH reaches.
  toolkit=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)
  export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${nccl:+:$nccl/lib}${cudnn:+:$cudnn/lib}:$toolkit/lib64:$toolkit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# The phases after build need its build-gpu/: a machine given back and started again has none.
ensure_built() {
  [ -f "$build/build.ninja" ] && [ -f "$build/bin/zero-train" ] && return 0
  echo "no $build/ here (a fresh machine): building first"
  phase_build
}

# Every kit library a built program loads must come from the kit (this machine has them in /usr too).
check_loads_from_kit() {
  local outside
  outside=$(for b in "$build"/bin/*; do ldd "$b"; done | grep -E 'lib(absl|gfortran|quadmath|openblas|benchmark)' |
    grep -v "$prefix" | sort -u || true)
  if [ -n "$outside" ]; then
    echo "loaded from outside the kit ($prefix):" >&2
    echo "$outside" >&2
    return 1
  fi
  echo "every Abseil, OpenBLAS, gfortran and benchmark library the programs load is the kit's"
}

phase_build() {
  nvcc --version | tail -1
  local nccl cudnn
  nccl=$(nccl_root)
  cudnn=$(cudnn_root)
  echo "kit: $(tr '\n' ' ' <.gpu-kit/MANIFEST)"
  echo "NCCL_ROOT: ${nccl:-none, NCCL beside the CUDA toolkit}"
  echo "CUDNN_ROOT: ${cudnn:-none, cuDNN beside the CUDA toolkit}"
  # /usr ignored: every dependency the image lacks must come from the kit, as it would on the GPU machine.
  cmake --fresh -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DZERO_WITH_CUDA=ON -DZERO_WITH_NCCL=ON -DZERO_WITH_CUDNN=ON -DZERO_WITH_MPI=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="${ZERO_CUDA_ARCH:-90}" \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_IGNORE_PREFIX_PATH=/usr ${nccl:+-DNCCL_ROOT="$nccl"} \
    ${cudnn:+-DCUDNN_ROOT="$cudnn"}
  grep -E '^(absl|GTest|benchmark|nlohmann_json|OpenBLAS)_DIR|^XXHASH_INCLUDE_DIR|^NCCL_(INCLUDE_DIR|LIBRARY)' \
    "$build/CMakeCache.txt"
  grep -E '^CUDNN_(INCLUDE_DIR|LIBRARY|FRONTEND_INCLUDE_DIR)' "$build/CMakeCache.txt"
  local found
  found=$(grep -E '^(absl|GTest|benchmark|nlohmann_json|OpenBLAS)_DIR|^XXHASH_INCLUDE_DIR|^CUDNN_FRONTEND_INCLUDE_DIR' \
    "$build/CMakeCache.txt")
  if grep -v "$prefix" <<<"$found"; then
    echo "the dependencies above were found outside the kit ($prefix)" >&2
    return 1
  fi
  # shellcheck disable=SC2086 # ZERO_GPU_TARGETS: a list of ninja targets, default every one
  time timeout 480 ninja -C "$build" ${ZERO_GPU_TARGETS:-}
  check_loads_from_kit
}

phase_test() {
  ensure_built
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  # 8 tests at once share the cores: one OpenMP thread per rank (tests of other counts set their own).
  OMP_NUM_THREADS=1 ZERO_REQUIRE_GPU=1 timeout 480 ctest --test-dir "$build" -j 8 --timeout 300 --output-on-failure
}

phase_sanitize() {
  ensure_built
  local sanitizer failed=0
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # Every run is made, a failing one noted, so one report shows them all; the phase fails after if any did.
  # seconds, tool, binary, the filter naming its CUDA tests, then the tool's own flags (the limits add up to 500 s)
  sanitize_cuda_tests() {
    echo "== compute-sanitizer --tool $2 ${*:5} $3 ($4)"
    ZERO_REQUIRE_GPU=1 timeout "$1" "$sanitizer" --tool "$2" "${@:5}" --error-exitcode 1 "$build/bin/$3" \
      --gtest_filter="$4" --gtest_brief=1 || { echo "== FAILED: $2 over $3 ($4)"; failed=1; }
  }
  # The kernel tests' memcheck the longest: their exact GEMM tests run GPT-2 124M's projection shapes.
  sanitize_cuda_tests 180 memcheck kernels_test '*Cuda*'
  # racecheck leaves out cuDNN's attention (on an H200 the process died inside its test under racecheck, no hazard
  # reported, while memcheck passes it) and cuBLAS's own nvjet kernels (on an H200 at 267ab71 racecheck reported
  # shared-memory hazards inside its split-K GEMMs, library code whose TMA and mbarrier synchronization it does not see).
  sanitize_cuda_tests 80 racecheck kernels_test '*Cuda*:-*Cudnn*' --kernel-name-exclude kns=nvjet
  sanitize_cuda_tests 80 memcheck device_api_test '*/Cuda'
  sanitize_cuda_tests 80 racecheck device_api_test '*/Cuda'
  # memcheck only: under racecheck, optim_test's CUDA tests ran past 120 s on an H200, with the square sum over 513
  # chunks' blocks and without it.
  sanitize_cuda_tests 80 memcheck optim_test '*/Cuda*'
  return "$failed"
}

# The embedded default for 300 steps, its metrics into $build/train/NAME.jsonl; extra flags pick device and backend.
train() {
  local name=$1
  shift
  echo "== zero-train $*"
  timeout 100 "$build/bin/zero-train" --steps=300 --scheduler.params.warmup_num_steps=30 --eval_interval=300 \
    --metrics_path="$build/train/$name.jsonl" "$@" | grep -E '^(zero-train|eval|step +(1|300)/)'
}

phase_train() {
  ensure_built
  rm -rf "$build/train" && mkdir -p "$build/train"
  mkdir -p "$build/train/export"
  train cpu --export_path="$build/train/export/"
  train cuda_local --device=cuda
  train cuda_offload --device=cuda --zero_optimization.offload_optimizer.device=cpu  # ZeRO-Offload
  # One rank evaluates eval_batches micro-batches alone: 4 times the default's 4 is what 4 ranks evaluate.
  train cuda_nccl --device=cuda --backend=nccl --ranks=1 --eval_batches=16
  python3 scripts/gpu/compare_losses.py "$build/train/cpu.jsonl" "$build/train/cuda_local.jsonl" \
    "$build/train/cuda_offload.jsonl" "$build/train/cuda_nccl.jsonl"
  python3 scripts/gpu/load_export.py "$build/train/export"
}

phase_bench() {
  ensure_built
  local batch gpu cudnn="1 0"
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "GPU: $gpu; python3: $(python3 -c 'import torch; print("torch", torch.__version__)')"
  bench_deadline=$((SECONDS + 510))  # the runs' budget, past the build a fresh machine makes first
  for batch in $(bench_batches); do
    # A batch that could not have its zero run and both baselines is left out, said, rather than failed for time.
    if [ $((bench_deadline - SECONDS)) -lt 120 ]; then
      echo "== B=$batch left out: $((bench_deadline - SECONDS)) s of the bench's 510 s are left"
      continue
    fi
    bench_batch "$batch" "$gpu" "$cudnn"
    cudnn=1  # the tiled kernels' row at the first batch alone: what cuDNN's attention is worth
  done
}

# The bench's batches, sequences per step: ZERO_GPU_BATCH's list, else 8 (where per-step costs such as the
# optimizer show) and llm.c's 64, the batch its GPT-2 124M MFU is quoted at.
bench_batches() {
  echo "${ZERO_GPU_BATCH:-8 64}"
}

# timeout, cut to what is left of the bench's 510 s, so its runs end inside the phase's 9 minutes at any batches.
bench_timeout() {
  local limit=$1 left=$((bench_deadline - SECONDS))
  shift
  [ "$left" -gt 0 ] || { echo "the bench's 510 s ran out before: $*" >&2; return 124; }
  timeout $((limit < left ? limit : left)) "$@"
}

# One batch: zero in bf16 end to end, its attention through cuDNN (1) and/or through the tiled kernels cuDNN
# replaces (0, ZERO_CUDNN_ATTENTION=0), beside PyTorch eager and torch.compile, with MFU.
bench_batch() {
  local batch=$1 gpu=$2 zero_csvs=() torch_csvs=() cudnn label run mode
  for cudnn in $3; do
    label="bf16, cuDNN attention"
    [ "$cudnn" = 1 ] || label="bf16, tiled attention"
    run="$build/zero_gpt2_b${batch}_cudnn_$cudnn"
    echo "== zero: GPT-2 124M, $label, B=$batch, T=1024, one rank (stage 0)"
    ZERO_CUDNN_ATTENTION=$cudnn bench_timeout 90 "$build/bin/zero-bench" stages --model=d12 --device=cuda \
      --dtype=bf16 --ranks=1 --stages=0 --batch="$batch" --seq=1024 --warmup=2 --iters=10 --csv="$run.csv" \
      2>"$run.err" || { cat "$run.err" >&2; return 1; }
    cat "$run.err" >&2
    # A refusal would time the tiled kernels under cuDNN's label.
    if grep -q "cuDNN attention refused" "$run.err"; then
      echo "cuDNN refused GPT-2 124M's attention (above): no cuDNN row" >&2
      return 1
    fi
    zero_csvs+=(--zero "$label=$run.csv")
  done
  for mode in eager compile; do
    run="$build/torch_b${batch}_$mode.csv"
    rm -f "$run"
    echo "== PyTorch ($mode): the same model and step, B=$batch"
    # A baseline that fails (eager may run out of memory at B=64) is reported and left out; zero's figures and
    # the other baseline still count.
    if bench_timeout 180 python3 benchmarks/torch_gpt2.py --mode="$mode" --batch="$batch" --seq=1024 --csv="$run"; then
      torch_csvs+=("$run")
    else
      echo "PyTorch $mode failed (exit $?): no $mode row"
    fi
  done
  [ ${#torch_csvs[@]} -gt 0 ] || { echo "no PyTorch baseline ran at B=$batch" >&2; return 1; }
  python3 scripts/gpu/bench_report.py --gpu="$gpu" "${zero_csvs[@]}" "${torch_csvs[@]}"
}

phase_stages() {
  ensure_built
  echo "== zero-bench stages on the GPU: GPT-2 124M, 4 local ranks sharing it, bf16, B=2, T=1024"
  timeout 300 "$build/bin/zero-bench" stages --model=d12 --device=cuda --dtype=bf16 --ranks=4 --batch=2 \
    --seq=1024 --warmup=1 --iters=3
  echo "== zero-bench comm on the GPU"
  timeout 100 "$build/bin/zero-bench" comm --device=cuda --ranks=4 --warmup=3 --iters=10
  timeout 100 "$build/bin/zero-bench" comm --device=cuda --backend=nccl --ranks=1 --warmup=3 --iters=10
}

phase_profile() {
  ensure_built
  local batch
  batch=$(bench_batches | awk '{print $1}')
  echo "== ncu: one GPT-2 124M bf16 step (B=$batch, T=1024, setup included)"
  # Device time per kernel, the clocks left as they are (ncu's own control would pin them lower).
  timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel --csv \
    "$build/bin/zero-bench" stages --model=d12 --device=cuda --dtype=bf16 --ranks=1 --stages=0 \
    --batch="$batch" --seq=1024 --warmup=0 --iters=1 >"$out/ncu.csv"
  python3 scripts/gpu/kernel_times.py "$out/ncu.csv"
}

case "$phase" in
  build | test | sanitize | train | bench | stages | profile) ;;
  *)
    echo "unknown phase '$phase'; $usage" >&2
    exit 2
    ;;
esac

# The report holds everything the phase prints; its last line says whether the phase passed.
run_phase() {
  echo "zero GPU check: $phase, $(date -u +%FT%TZ), tree $(cat .gpu-kit/REV 2>/dev/null || echo unknown)"
  trap 'echo "RESULT $phase: FAILED (line $LINENO: $BASH_COMMAND)"' ERR
  phase_env
  "phase_$phase"
  echo "RESULT $phase: PASSED"
}
run_phase 2>&1 | tee "$report"
