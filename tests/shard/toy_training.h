// Trains the toy model under the engine on one rank or on in-process ranks, for the engine's suites.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "optim/optimizers.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "shard/engine.h"
#include "tests/shard/hooked_model.h"
#include "tests/shard/toy_model.h"

namespace zero::testing {

inline constexpr int64_t kGlobalBatch = 48;  // rows per optimizer step: divisible by N * A in every suite

OptimizerFactory adamw_factory();
OptimizerFactory sgd_factory();

struct TrainRun {
  ToyConfig model;
  ZeroConfig zero;
  int world_size = 1;
  int steps = 3;
  float lr = 0.05f;
  OptimizerFactory optimizer = adamw_factory();
  std::optional<int64_t> budget;
  int first_step = 0;           // steps read the global data of steps first_step, first_step + 1, ...
  std::string load_checkpoint;  // loaded before the first step; "" = none
  std::string save_checkpoint;  // saved after the last step; "" = none
  bool evaluate_first = false;  // each micro-batch goes through Engine::evaluate before its step
  UnitHooks hooks;              // around every unit's forward and backward, on every rank
  // Also before every unit's forward and backward, with the rank's allocator.
  std::function<void(const std::string& event, const Allocator& allocator)> on_unit_start;
  // After each step (the index of the global data it read), on every rank: anything the engine takes between steps.
  std::function<absl::Status(Engine& engine, int step)> after_step;
};

// What one rank saw.
struct RankResult {
  std::vector<float> params;             // every parameter (as fp32), flat, in unit and declaration order
  std::vector<StepResult> steps;         // per step
  std::vector<Evaluation> evaluations;   // per micro-batch, with evaluate_first
  MemoryStats memory;                    // after the steps
  MemoryStats held_at_end;               // before the engine is destroyed (what it holds, in RAM and in files)
  int64_t file_bytes_in_ram_at_end = 0;  // Allocator::file_bytes_in_ram then, after the last visit's gathers
  CommVolume last_step;                  // bytes sent in the last step
  int64_t padded_params = 0;
};

// The pacings of the NVMe optimizer swapper the tests train under (ZeroConfig::optimizer_swap): DeepSpeed's default,
// both pipelines with room for two units (bf16 AdamW), each pipeline alone, and room for every unit.
inline constexpr ZeroConfig::OptimizerSwap kOptimizerSwapModes[] = {
    {},
    {.buffer_count = 6, .pipeline_read = true, .pipeline_write = true},
    {.buffer_count = 6, .pipeline_read = true},
    {.buffer_count = 6, .pipeline_write = true},
    {.buffer_count = 100, .pipeline_read = true, .pipeline_write = true},
};

// Every parameter of `engine` (as fp32), flat, in unit and declaration order (Engine::visit_full_params).
absl::StatusOr<std::vector<float>> full_params(Engine& engine);

// Trains `run` on this rank: each step's global batch is split evenly over ranks and micro-batches.
absl::StatusOr<RankResult> train_rank(Communicator& comm, const TrainRun& run);

// The same on run.world_size in-process ranks (local backend): every rank's result, and the root cause.
struct LocalOutcome {
  std::vector<RankResult> ranks;
  absl::Status status;
};
LocalOutcome train_local(const TrainRun& run);

// Same length and the same bits.
bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace zero::testing
