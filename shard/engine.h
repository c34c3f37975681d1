// The ZeRO engine: one training step over flat units, orchestrating the stage's gathers, reductions and update.
//
// Per rank, for a model of Ψ parameters over N ranks, with p = 4 (fp32) or 2 (bf16/fp16) bytes per
// parameter and gradient, and m = 0 (fp32) or 4 (fp32 master weights) (docs/architecture.md):
//   stage 0  params pΨ    grads pΨ    master+Adam (m+8)Ψ    allreduce grads during backward
//   stage 1  params pΨ    grads pΨ    master+Adam (m+8)Ψ/N  reduce-scatter grads, update own slice, allgather
//   stage 2  params pΨ    grads pΨ/N  master+Adam (m+8)Ψ/N  as 1, grads held only as the owned slice
//   stage 3  params pΨ/N  grads pΨ/N  master+Adam (m+8)Ψ/N  allgather each unit before forward and backward
// plus, in comm_buffers, the gradient buckets in flight, (stage 3) the gathered units alive and (ZeRO-Offload) the
// pinned transfer buffers.
//
// Where each concern lives: what a stage partitions, shard/stage.h; the units' buffers and ranges,
// shard/unit_state.h; parameter gathers, shard/gatherer.h; gradient buckets and reductions,
// shard/reducer.h; fp16 loss scaling, shard/loss_scaler.h; NVMe offload, shard/offload.h; bytes and
// phase times, shard/meter.h; checkpoints, shard/checkpoint.cc. This file orders them into a step.
//
// Every stage reduces every micro-batch (stages 0-1 under no_sync: only the last; stage 0 on one rank with one
// micro-batch a step none, adding into its held gradients directly) and adds the reduced gradient into what it
// holds, scaling each rank's gradient by 1/(N·accumulation_steps) first; with the
// local backend's rank-order reductions and partition-independent optimizers, stages 0-3 produce
// bit-identical parameters.
//
// Contracts:
// - The model, communicator and allocator must outlive the engine; the engine's buffers go back to the
//   allocator when it is destroyed, after it has waited for every collective still writing into them.
// - One thread (its rank's) uses an engine; ranks run their engines concurrently, each on its own.
// - Every call but the accessors and load_params is a collective: every rank makes it, in the same order.
// - A call refused before any work (a precondition, a wrong argument) leaves the engine as it was. After
//   any other failure the step's gradients and gathered copies are undefined and the communicator has
//   usually failed: destroy the engine, and resume from a checkpoint in a new one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "optim/optimizer.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "runtime/cpu_stream.h"
#include "runtime/device_api.h"
#include "shard/config.h"
#include "shard/gatherer.h"
#include "shard/host_offload.h"
#include "shard/loss_scaler.h"
#include "shard/meter.h"
#include "shard/module.h"
#include "shard/offload.h"
#include "shard/reducer.h"
#include "shard/stage.h"
#include "shard/step_metrics.h"
#include "shard/unit_state.h"
#include "shard/wrap.h"

namespace zero {

// Builds the optimizer for one unit's shard on `device` (the engine decides the layout and the device:
// ZeroConfig::device).
using OptimizerFactory =
    std::function<absl::StatusOr<std::unique_ptr<Optimizer>>(ShardLayout layout, Allocator& allocator, Device device)>;

struct StepResult {
  float loss = 0;       // mean over micro-batches and ranks
  int64_t correct = 0;  // summed over micro-batches and ranks
  int64_t predictions = 0;
  double grad_norm = 0;   // global L2 norm before clipping (computed with clipping or fp16 only)
  bool skipped = false;   // fp16: the gradients overflowed on some rank, so no rank updated
  double loss_scale = 1;  // the scale this step's gradients carried
};

// One forward-only pass over this rank's micro-batch (Engine::evaluate), nothing reduced across ranks.
struct Evaluation {
  float loss = 0;
  int64_t correct = 0;
  int64_t predictions = 0;
};

struct UnitCheckpoint;  // what a rank reads of one flat unit from a checkpoint (shard/checkpoint.cc)

class Engine {
 public:
  // Allocates parameters, gradients and optimizer state for this rank and initializes parameters from
  // their ParamSpec inits (bit-identical for every stage and world size). With an allocator budget,
  // also reserves the largest transient buffers once (buckets, gathered units), so a model that cannot
  // fit fails here with OutOfMemory rather than in the middle of a step; activations depend on the
  // batch and are not reserved (a batch too large fails in its first forward, with OutOfMemory).
  // The allocator's peaks restart when it returns, so they measure the steps.
  static absl::StatusOr<std::unique_ptr<Engine>> create(Model& model, Communicator& comm, Allocator& allocator,
                                                        OptimizerFactory make_optimizer, ZeroConfig config);
  ~Engine();  // waits for a delayed update in flight, and reports on stderr a failure of it nothing reported

  // One optimizer step over config.accumulation_steps micro-batches of this rank, at learning rate lr.
  absl::StatusOr<StepResult> train_step(std::span<const Batch> micro_batches, float lr);

  // The same in pieces, for custom loops: forward+backward once per micro-batch, then step.
  absl::Status forward_backward(const Batch& batch);
  absl::StatusOr<StepResult> step(float lr);

  // Applies the update a step left in flight under ZeroConfig::delayed_update_after: waits for it, reports its
  // failure, and sends its parameters to the device. The next step, save_checkpoint, load_checkpoint, load_params and
  // visit_full_params do it first themselves; call it after the last step, so that evaluate() sees the last update
  // and its failure is not lost. Nothing when no update is in flight. A collective (stages 1-2 allgather the
  // slices of units kept whole).
  absl::Status apply_delayed_update();

  // Forward only, for evaluation, between steps: stage 3 gathers each unit just for its forward,
  // prefetching up to max_live_units ahead (a collective: every rank calls it), and no gradient is
  // touched. `on_output`, when given, sees the last unit's output (the logits, on ZeroConfig::device)
  // while it is valid. Each unit's Unit::release_saved frees what it saved once the next unit has read
  // its output.
  absl::StatusOr<Evaluation> evaluate(const Batch& batch,
                                      const std::function<absl::Status(const Tensor& output)>& on_output = nullptr);

  // Calls visit(unit, param, value) for every parameter with its full value (a collective at stage 3:
  // every rank must call it). For evaluation and export.
  absl::Status visit_full_params(
      const std::function<absl::Status(absl::string_view unit, absl::string_view param, const Tensor& value)>& visit);
  // Sets every parameter: fill(unit, param, dst) writes the full value into dst (fp32, the param's shape).
  absl::Status load_params(
      const std::function<absl::Status(absl::string_view unit, absl::string_view param, Tensor dst)>& fill);

  // Checkpoints (shard/checkpoint.cc). save_checkpoint writes directory `dir`: one safetensors file per
  // rank with the fp32 parameters (master weights) and optimizer state of the range the rank updates,
  // keyed by model parameter, plus the step count, the loss scaler and the caller's `extra` strings.
  // It is written as `dir`.partial and renamed once every rank has written, so a failure on any rank
  // fails every rank and leaves an earlier checkpoint at `dir` as it was. load_checkpoint reads one
  // saved under any world size, stage, wrap policy or precision, for the same model and optimizer
  // state, checks it covers every element this rank needs before changing anything, and returns the
  // `extra` strings. With the same N, stage and precision, training on is bitwise identical to never
  // stopping. Both are collectives, called between steps.
  absl::Status save_checkpoint(const std::string& dir, const std::map<std::string, std::string>& extra = {});
  absl::StatusOr<std::map<std::string, std::string>> load_checkpoint(const std::string& dir);

  const ZeroConfig& config() const { return config_; }
  int64_t steps_taken() const { return step_count_; }
  // Ψ: parameters of the model, and the same padded to multiples of N per unit.
  int64_t num_params() const;
  int64_t num_padded_params() const;
  CommVolume comm_volume() const { return meter_.volume(); }
  void reset_comm_volume() { meter_.reset_volume(); }
  PhaseTimes phase_times() const { return meter_.phase_times(); }
  void reset_phase_times() { meter_.reset_phase_times(); }

 private:
  Engine(Model& model, Communicator& comm, Allocator& allocator, ZeroConfig config);
  absl::Status build(OptimizerFactory make_optimizer);
  absl::Status allocate_unit(UnitState& u, const OptimizerFactory& make_optimizer);
  absl::Status initialize_params();
  // With a budget: the largest transient set (buckets and gathered units alive at once) fits beside what
  // is held, so a model that cannot fit fails before the first step.
  absl::Status reserve_transient();
  // values[k] is flat element first + k (fp32, on the host), covering at least what this rank holds.
  absl::Status assign_params(UnitState& u, const float* values, int64_t first);
  // NVMe offload: every optimizer tensor in its file and none in transfer, for a path outside the update (which
  // the swapper paces) that pages units in and out itself.
  absl::Status settle_offload();

  // Which units take part in this micro-batch (Unit::runs); an error if the first or last would not.
  absl::StatusOr<std::vector<bool>> units_that_run(const UnitContext& ctx) const;
  absl::StatusOr<ParamViews> param_views(int i) const;
  // The units that run, forward: the last one's output. An evaluation frees what each unit saved once
  // the next has read its output (Unit::release_saved).
  absl::StatusOr<Tensor> forward(UnitContext& ctx, const std::vector<bool>& runs, bool evaluation);
  absl::Status backward(UnitContext& ctx, const std::vector<bool>& runs);
  absl::StatusOr<double> global_grad_norm();
  // Where the norm is not finite and no loss scaler skips the step (fp32, bf16): Aborted on every rank,
  // naming the first unit whose gradient holds a NaN or infinity. A collective.
  absl::Status non_finite_gradients();
  // What one step's update applies, fixed once the step has decided it.
  struct UpdateArgs {
    float lr = 0;
    double loss_scale = 1;        // the scale this step's gradients carry, which the update divides out
    double clip_coefficient = 1;  // < 1 where the global norm is clipped
    int64_t step = 0;             // the optimizer step it is, from 1
  };
  absl::Status update(const UpdateArgs& args);
  // Where slices of parameters update (stages 1-3) with an optimizer that needs whole-parameter norms (LAMB, LARS):
  // every unit's first pass, then their norms summed across ranks in one allreduce; one entry per unit, empty for
  // a unit whose optimizer takes none. Empty where nothing was measured.
  absl::StatusOr<std::vector<WholeParamNorms>> measure_norms(const UpdateArgs& args);
  // Unit i's update, given its measured norms where it has them; under ZeRO-Offload the parameters go back after.
  absl::Status update_unit(int i, const UpdateArgs& args, const WholeParamNorms* norms);
  // Runs `use` with unit i's offloaded files in RAM (NVMe offload: its parameter shard, its optimizer tensors).
  absl::Status with_unit_in_ram(int i, const std::function<absl::Status()>& use);
  // What unit i's optimizer steps: the fp32 tensor it updates (the master weights, or the fp32 params), its fp32
  // gradient, and where the training-dtype parameters go (the half copy, or a cast after the step). Under
  // ZeRO-Offload the gradient is the streamed one on the host and the parameters their pinned buffer.
  struct UnitStep {
    Tensor target;
    Gradients grads;  // in the training dtype, unscaled and clipped by the optimizer as it reads them
    HalfCopy half;
    Tensor cast_after;  // fp32 ZeRO-Offload: the params, cast from the master weights after the step
  };
  absl::StatusOr<UnitStep> unit_step(int i, const UpdateArgs& args);
  // Steps unit i's optimizer on unit_step's tensors (the delayed update's, on the host, too).
  absl::Status step_optimizer(int i, const UpdateArgs& args, const WholeParamNorms* norms);
  // Runs `update_one` on every unit in order, allgathering behind it the slices of the units kept whole where each
  // rank updates a slice.
  absl::Status update_each_unit(const std::function<absl::Status(int i)>& update_one);

  // ZeRO-Offload's delayed parameter update (ZeroConfig::delayed_update_after).
  bool delays_this_update() const;
  // Starts this step's host update on a thread of its own, last unit first (the order the next backward hands
  // the gradient buffers back), and returns.
  absl::Status start_delayed_update(const UpdateArgs& args);
  // Waits until the delayed update in flight has read unit i's gradient buffer, which the next copy overwrites.
  void wait_until_updated(int i);
  absl::Status require_between_steps(absl::string_view call) const;

  // Checkpoints (shard/checkpoint.cc): writing this rank's file; what this rank needs of each unit
  // (zeroed host buffers); and putting what was read in place.
  absl::Status write_checkpoint_file(const std::string& path, const std::string& save_id,
                                     const std::map<std::string, std::string>& extra);
  absl::StatusOr<std::vector<UnitCheckpoint>> checkpoint_targets();
  // How this rank's range of every unit is cut where each rank updates a slice (world size, flat units
  // and their padded sizes): a checkpoint saved with the same layout has all of rank r's range in rank
  // r's file. "" where every rank updates everything.
  std::string checkpoint_layout() const;
  absl::Status install_checkpoint(const std::vector<UnitCheckpoint>& units);
  // DataLoss naming the files when the rank files the ranks read as their own come from different saves.
  // A collective.
  absl::Status check_same_save_on_every_rank(const std::map<std::string, std::string>& own, const std::string& dir);

  Model& model_;
  std::unique_ptr<WrappedModel> wrapped_;  // the units as flattened: the model's, small runs merged
  Communicator& comm_;
  Allocator& allocator_;
  const ZeroConfig config_;
  const StagePolicy policy_;
  const DType dtype_;    // config_.precision
  const Device device_;  // config_.device
  // Where the master weights and the optimizer state live and the optimizer steps: device_, or the CPU under
  // config_.offload_optimizer_to_host.
  const Device optimizer_device_;
  // On a device: the rank's compute stream, non-blocking, where its kernels, memory and copies go. Every public
  // call makes it current, ordered with the caller's current stream both ways (compute_scope()); collectives are
  // ordered with it by events (Work::wait). Ranks sharing a GPU each run on their own.
  struct ComputeStream {
    OwnedStream stream;
    OwnedEvent marker;  // JoinedStreamScope's
  };
  std::optional<ComputeStream> compute_;
  JoinedStreamScope compute_scope() const;
  CommMeter meter_;
  LossScaler scaler_;
  std::vector<UnitState> units_;
  std::optional<HostOffload> host_offload_;  // under config_.offload_optimizer_to_host
  // The delayed update in flight, between the step that started it and the next one (or a call that reads or
  // writes the whole state).
  struct DelayedUpdate {
    absl::Mutex mu;
    std::vector<bool> updated ABSL_GUARDED_BY(mu);  // per unit: its gradient read, its parameters written
    absl::Status status ABSL_GUARDED_BY(mu);        // the first unit's failure
    int64_t step = 0;                               // the optimizer step it is
  };
  std::unique_ptr<DelayedUpdate> delayed_;
  // The thread the delayed updates run on, made at the first (config_.delayed_update_after >= 0). ~Engine waits for
  // its task before any member goes, since the task uses the gatherer, the reducer and the units.
  std::unique_ptr<CpuStream> update_worker_;
  // Under config_.offload_optimizer_path; declared after units_, so destroyed first, waiting for its transfers.
  std::unique_ptr<OptimizerSwapper> swapper_;
  // Declared after units_, so destroyed first: each waits for its collectives in flight.
  std::unique_ptr<ParamGatherer> gatherer_;
  std::unique_ptr<GradientReducer> reducer_;

  int micro_batches_done_ = 0;
  int64_t step_count_ = 0;
  std::optional<StepMetrics> metrics_;  // made by build()
};

}  // namespace zero
