// zero-bench stages: one GPT-2 trained under ZeRO stages 0-3, memory, bytes and step time beside the formulas and stage
// 0.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/bench/bench_common.h"
#include "examples/common/result_table.h"
#include "models/gpt2_config.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "shard/engine.h"

namespace zero {

struct StagesBenchOptions {
  Gpt2Config model;
  std::vector<int> stages = {0, 1, 2, 3};
  int64_t batch = 4;     // B per rank per micro-batch
  int64_t seq_len = 64;  // T
  DType precision = DType::kF32;
  Device device = Device::cpu();  // --device's: cuda:0 for every local rank on the GPU (see rank_device)
  bool tf32 = false;              // the fp32 GEMMs in TF32 (ZeroConfig::tf32; CUDA only)
  Repetitions reps;
  std::string offload_optimizer_path;        // "" = optimizer state in RAM (ZeroConfig::offload_optimizer_path)
  std::string offload_param_path;            // "" = stage 3's parameter shards in RAM (ZeroConfig::offload_param_path)
  bool offload_optimizer_to_host = false;    // ZeroConfig::offload_optimizer_to_host (an engine on a device)
  bool offload_param_to_host = false;        // ZeroConfig::offload_param_to_host (stage 3, with the above)
  ZeroConfig::OptimizerSwap optimizer_swap;  // how the files' transfers are paced (ZeroConfig::optimizer_swap)
  int64_t persistence_threshold = ZeroConfig{}.persistence_threshold;  // stage 3: smaller units stay whole
  bool torch = false;  // also PyTorch's counterpart of each stage (benchmarks/torch_stages.py)
};

// One stage as rank 0 saw it; times are the slowest rank's.
struct StageRow {
  int stage = 0;
  int world_size = 1;
  double step_ms = 0;       // the median of the timed steps
  double tokens_per_s = 0;  // N·B·T per step / step time
  // Rank 0's time per step blocked on communication (PhaseTimes::waiting); measured on the CPU only.
  std::optional<double> wait_ms;
  MemoryStats memory;               // rank 0's peaks over the run
  int64_t formula_model_state = 0;  // shard/plan.h's params + grads + master + optimizer in RAM for this model
  int64_t in_files = 0;             // rank 0's model states in offload files
  int64_t formula_in_files = 0;     // shard/plan.h's
  // Bytes rank 0 moves per step to and from where its states are offloaded (shard/plan.h's sizes): each byte in
  // files read and written once; ZeRO-Offload's gradients out and parameters in, and each host shard in for its
  // unit's two gathers (forward and backward).
  int64_t formula_offload_traffic = 0;
  CommVolume sent;             // rank 0's bytes in the last step
  int64_t formula_sent = 0;    // shard/plan.h's gathers + reductions per step
  int64_t kept_for_reuse = 0;  // rank 0's freed host blocks the allocator kept after the last step

  // Rank 0's peak params + grads + master weights + optimizer state in RAM, beside formula_model_state.
  int64_t model_state_peak() const;
};

// Runs on every rank of `comm`: the model under each stage in turn, fresh engine per stage, same data.
absl::StatusOr<std::vector<StageRow>> run_stages_bench(Communicator& comm, const StagesBenchOptions& options);
// One stage of it.
absl::StatusOr<StageRow> run_stage(Communicator& comm, const StagesBenchOptions& options, int stage);
// The flags stages and offload share: --model ("mini" or a GPT-2 preset), --stages, --batch, --seq,
// --dtype, --device, --warmup and --iters; and a line describing the model and batch they give.
absl::StatusOr<StagesBenchOptions> stages_options_from_flags();
std::string describe_model(const StagesBenchOptions& options);

// stage, step_ms, tokens/s, vs_stage0, per-category peaks (MiB), model state vs formula, sent vs formula,
// wait_ms.
ResultTable stages_bench_table(const std::vector<StageRow>& rows);

// The `stages` subcommand: reads the flags, runs on --backend, prints the table on rank 0, writes --csv
// and, with --png, renders it with gnuplot.
absl::Status stages_command();

}  // namespace zero
