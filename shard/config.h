// ZeroConfig: the stage and the knobs of bucketing, prefetch, accumulation and clipping.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace zero {

// fp16 dynamic loss scaling, with DeepSpeed's keys and defaults: the loss gradient is multiplied by the
// scale; a step whose gradients overflow on any rank is skipped on every rank and the scale halved,
// except that the first `hysteresis` - 1 overflows after a start or a scale-up only use up the
// hysteresis; after `window` good steps in a row the scale doubles and the hysteresis refills.
struct LossScaling {
  double initial_scale = 65536.0;  // 2^initial_scale_power
  int window = 1000;               // loss_scale_window
  int hysteresis = 2;
  double min_scale = 1.0;     // min_loss_scale
  double static_scale = 0.0;  // loss_scale: 0 = dynamic, otherwise a fixed scale
};

struct ZeroConfig {
  int stage = 0;  // 0 DDP, 1 optimizer state, 2 + gradients, 3 + parameters partitioned

  // Wrap policy (shard/wrap.h): consecutive model units are merged into one flat unit until it holds
  // this many parameters, as FSDP's size-based auto-wrap; 0 keeps one flat unit per model unit.
  int64_t wrap_min_params = 0;

  // Stage 0 packs consecutive units' gradients (in reverse order) into buckets of at most this many
  // bytes, the first one smaller so communication starts early (PyTorch DDP's 25 MB and 1 MB). Stages
  // 1-3 reduce-scatter one flat unit at a time, as FSDP does: a bucket spanning units could not give
  // each rank a contiguous slice of every unit.
  int64_t bucket_cap_bytes = int64_t{25} << 20;
  int64_t first_bucket_cap_bytes = int64_t{1} << 20;

  // Stage 3: at most this many gathered units alive at once, counting prefetches, and units with
  // fewer elements than the threshold stay gathered (DeepSpeed's stage3_param_persistence_threshold).
  int max_live_units = 2;
  int64_t persistence_threshold = 100000;

  // Parameters and gradients in this dtype (fp32, bf16 or fp16); with bf16/fp16 the optimizer updates
  // fp32 master weights held, like its state, only for the rank's slice (stage 0: whole).
  DType precision = DType::kF32;
  LossScaling loss_scaling;  // fp16 only

  int accumulation_steps = 1;  // micro-batches per optimizer step
  // Stages 0-1 only: accumulate micro-batches in the local gradients and reduce once per step, as DDP's
  // no_sync (A times less gradient traffic). Off, every stage reduces every micro-batch, which keeps
  // stages 0-3 bit-identical; stages 2-3 hold only their gradient slice, so they always do.
  bool no_sync = false;
  double gradient_clipping = 0;  // max global L2 norm of the gradients; 0 turns clipping off
  float weight_decay = 0.0f;     // for parameters not matching no_decay_patterns
  std::vector<std::string> no_decay_patterns = {"*bias", "*ln_*", "*norm*"};
  uint64_t seed = 1234;  // parameter initialization

  // Where parameters, gradients, buckets, gathered units, master weights and optimizer state live: the
  // CPU, or cuda:k (a CUDA build; the communicator must reach that device's memory: nccl, or local for
  // several ranks on one GPU). The models run there too (UnitContext::device), so the caller puts each
  // batch there; values given to and taken from the engine (load_params, visit_full_params,
  // checkpoints) stay on the host, and the engine copies them.
  Device device = Device::cpu();
  // The models' fp32 GEMMs on tensor cores, their operands rounded to TF32 (UnitContext::tf32, as PyTorch's
  // allow_tf32): faster, about 3 decimal digits per operand. CUDA only: the CPU has no TF32.
  bool tf32 = false;

  // "" keeps the optimizer state and fp32 master weights in RAM. A directory (on an NVMe drive) holds
  // them in files instead, as ZeRO-Infinity's offload_optimizer: each unit's are read in for its update and
  // written back and dropped from RAM after it, as optimizer_swap paces them, bit-identical results.
  std::string offload_optimizer_path;
  // With offload_optimizer_path: how the units' optimizer tensors move between their files and RAM (DeepSpeed's
  // offload_optimizer keys; shard/offload.h's OptimizerSwapper). The defaults are DeepSpeed's: one unit's at a
  // time, each read when its update starts and written back before the next unit's.
  struct OptimizerSwap {
    // How many optimizer tensors (the fp32 master weights, each optimizer state) RAM holds at once, counted as
    // DeepSpeed counts its swap buffers; a unit's update needs all of its own, so this divided by one unit's
    // tensors is how many units' RAM holds.
    int buffer_count = 4;
    // Reads ahead: the next units' tensors while one updates, and the first units' of the next step once the
    // update ends, so that they arrive while the forward and backward compute.
    bool pipeline_read = false;
    // Writes behind: a unit's tensors go back to their file while the next units update.
    bool pipeline_write = false;
  };
  OptimizerSwap optimizer_swap;
  // Stage 3 only: "" keeps each rank's parameter shards in RAM. A directory holds them in files instead,
  // as ZeRO-Infinity's offload_param: a unit's shard is paged in to be gathered or updated and dropped
  // from RAM once that is done, so RAM holds the gathered units, not the shards. Units kept whole
  // (persistence_threshold) stay in RAM, as DeepSpeed keeps persistent parameters on the device.
  std::string offload_param_path;
  // An engine on a device (cuda, sim): true keeps the fp32 master weights (under fp32 training too) and the
  // optimizer state in host memory and steps the optimizer on the CPU, as ZeRO-Offload's offload_optimizer.device
  // = cpu (shard/host_offload.h): each unit's gradient streams to pinned host memory as soon as its last reduction
  // of the step is in, overlapping the rest of backward; the update widens, unscales and clips it on the host, steps
  // the CPU optimizer on the master weights, and streams the parameters back in the training dtype. Bit-identical
  // to keeping them on the device.
  bool offload_optimizer_to_host = false;
  // Stage 3, with offload_optimizer_to_host: each rank's parameter shards live in host memory too, as ZeRO-Offload's
  // offload_param.device = cpu; a shard is copied to the device for each gather (freed once the gather finished),
  // and the host optimizer writes it in place. The device holds the gathered units, gradients and activations.
  // Units kept whole (persistence_threshold) stay on the device.
  bool offload_param_to_host = false;
  // With offload_optimizer_to_host: ZeRO-Offload's delayed parameter update (DPU) once this many steps have been
  // taken (-1: never). The CPU update of step k > delayed_update_after runs on a thread of its own beside the
  // forward and backward of step k+1, whose kernels therefore read the parameters of step k-1 (one step stale:
  // step k+1's gradient is taken at the parameters of step k-1); step k+1 sends step k's parameters to the device
  // before its own update starts. The steps up to it (the warm-up, where the parameters change fastest) update at
  // once. A checkpoint, load_params, load_checkpoint or visit_full_params applies the update in flight first.
  int64_t delayed_update_after = -1;

  // Time each step's phases (Engine::phase_times), as DeepSpeed's wall_clock_breakdown. On a GPU the
  // device is synchronized at each phase's start and end so the time is the phase's own work, which
  // costs the overlap across phases; on the CPU reading the clock is all it costs.
  bool time_phases = false;

  // InvalidArgument naming the field, as `key_prefix` + its name, when a value is out of range or two
  // values contradict each other (a tool passes the section its keys live in).
  absl::Status validate(absl::string_view key_prefix = "ZeroConfig.") const;

  // The gradient buckets of flat units of these padded element counts (in unit order), in backward
  // order, each the indices of its units in backward order: stage 0 packs consecutive units up to the
  // caps above, stages 1-3 take one unit per bucket. The engine's buckets (Engine::plan_buckets).
  std::vector<std::vector<int>> gradient_buckets(const std::vector<int64_t>& padded_numels) const;
  // Whether gradients go through those buckets on `world_size` ranks: not where one rank holds them all (stage 0)
  // and takes one micro-batch a step, with nothing to scale or reduce; its backward adds where they are held.
  bool stages_gradients(int world_size) const;
};

}  // namespace zero
