// The ZeRO engine: flat units, stage 0-3 partitioning, bucketed reduction, stage-3 gathers with prefetch.
//
// Per rank, for a model of Ψ parameters over N ranks, with p = 4 (fp32) or 2 (bf16/fp16) bytes per
// parameter and gradient, and m = 0 (fp32) or 4 (fp32 master weights) (see DESIGN.md):
//   stage 0  params pΨ    grads pΨ    master+Adam (m+8)Ψ    allreduce grads during backward
//   stage 1  params pΨ    grads pΨ    master+Adam (m+8)Ψ/N  reduce-scatter grads, update own slice, allgather
//   stage 2  params pΨ    grads pΨ/N  master+Adam (m+8)Ψ/N  as 1, grads held only as the owned slice
//   stage 3  params pΨ/N  grads pΨ/N  master+Adam (m+8)Ψ/N  allgather each unit before forward and backward
// plus, in comm_buffers, the gradient buckets in flight and (stage 3) the gathered units alive, and in
// workspace one unit's fp32 gradient slice during a mixed-precision update.
//
// Every stage reduces every micro-batch (stages 0-1 under no_sync: only the last) and adds the reduced
// gradient into what it holds, scaling each rank's gradient by 1/(N·accumulation_steps) first; with the
// local backend's rank-order reductions and partition-independent optimizers, stages 0-3 produce
// bit-identical parameters.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "optim/optimizer.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "shard/config.h"
#include "shard/flat_unit.h"
#include "shard/module.h"
#include "shard/wrap.h"

namespace zero {

// Builds the optimizer for one unit's shard on `device` (the engine decides the layout and the device:
// ZeroConfig::device).
using OptimizerFactory = std::function<absl::StatusOr<std::unique_ptr<Optimizer>>(ShardLayout layout,
                                                                                   Allocator& allocator, Device device)>;

struct StepResult {
  float loss = 0;           // mean over micro-batches and ranks
  int64_t correct = 0;      // summed over micro-batches and ranks
  int64_t predictions = 0;
  double grad_norm = 0;     // global L2 norm before clipping (computed with clipping or fp16 only)
  bool skipped = false;     // fp16: the gradients overflowed on some rank, so no rank updated
  double loss_scale = 1;    // the scale this step's gradients carried
};

// One forward-only pass over this rank's micro-batch (Engine::evaluate), nothing reduced across ranks.
struct Evaluation {
  float loss = 0;
  int64_t correct = 0;
  int64_t predictions = 0;
};

// Bytes this rank sent, by purpose.
struct CommVolume {
  int64_t param_gather = 0;  // stage 3 gathers, stage 1-3 parameter allgathers after the update
  int64_t grad_reduce = 0;   // bucket allreduces and reduce-scatters
  int64_t small = 0;         // loss, metrics and gradient-norm allreduces
};

// Wall time of this rank's compute thread per phase, summed over steps (ZeroConfig::time_phases).
// `waiting` is the part of the three it spent blocked on a collective: communication that overlap did not
// hide behind compute (on a GPU, also the device finishing the kernels a collective was ordered after).
struct PhaseTimes {
  absl::Duration forward;   // the units' forward passes, with the stage-3 gathers they waited for
  absl::Duration backward;  // backward passes, gathers, and the gradient reductions to their end
  absl::Duration update;    // step(): gradient norm, optimizer, stage 1-2 parameter allgathers, metrics
  absl::Duration waiting;
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
  ~Engine();

  // One optimizer step over config.accumulation_steps micro-batches of this rank, at learning rate lr.
  absl::StatusOr<StepResult> train_step(std::span<const Batch> micro_batches, float lr);

  // The same in pieces, for custom loops: forward+backward once per micro-batch, then step.
  absl::Status forward_backward(const Batch& batch);
  absl::StatusOr<StepResult> step(float lr);

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
  CommVolume comm_volume() const { return volume_; }
  void reset_comm_volume() { volume_ = {}; }
  PhaseTimes phase_times() const { return phase_times_; }
  void reset_phase_times() { phase_times_ = {}; }

 private:
  // One flat unit on this rank.
  struct UnitState {
    Unit* unit = nullptr;
    std::string name;
    FlatLayout layout;
    bool sharded = false;  // stage 3 and not persistent: params held as the owned slice only
    // The flat range it holds: its slice of rank `rank` when sharded, else all of it (padded).
    int64_t held_begin(int rank) const { return sharded ? layout.shard_begin(rank) : 0; }
    int64_t held_numel() const { return sharded ? layout.shard_numel : layout.padded_numel; }
    std::vector<int> needs;  // units whose parameters it reads: itself, then owners of tied params
    Buffer params;           // (padded) or, when sharded, (shard); in the engine's precision
    Buffer master;           // bf16/fp16 only: fp32 of the elements this rank updates
    Buffer grads;            // stage 0/1 (padded), stage 2/3 (shard)
    Buffer gathered;         // sharded units while gathered: (padded), in comm_buffers
    std::optional<Work> gather;  // in flight
    std::unique_ptr<Optimizer> optimizer;
    int bucket = 0;
    int64_t bucket_offset = 0;  // element offset of this unit's gradient in its bucket
  };
  // Consecutive units (in backward order) whose gradients are reduced by one collective.
  struct Bucket {
    std::vector<int> units;
    int64_t numel = 0;
    Buffer staging;  // (numel), comm_buffers, alive from the first gradient written until reduced
    int remaining = 0;
    std::optional<Work> reduction;
  };

  Engine(Model& model, Communicator& comm, Allocator& allocator, ZeroConfig config);
  absl::Status build(OptimizerFactory make_optimizer);
  // InvalidArgument naming the ranks whose units (names, parameters, sizes) differ from rank 0's.
  absl::Status check_same_model_on_every_rank();
  // ZeroConfig::offload_optimizer_path: the optimizer state and master weights go to files there.
  absl::Status place_optimizer_in_files();
  // The unit's parameters as held: in a file under ZeroConfig::offload_param_path when sharded.
  absl::StatusOr<Buffer> allocate_params(const UnitState& u);
  // Sends what of a unit is in files (shard, master weights, optimizer state) back to them and drops it
  // from RAM, once it has been written or read; nothing for what is in RAM. So RAM holds one unit's at
  // a time.
  absl::Status page_out_offloaded(const UnitState& u);
  absl::Status initialize_params();
  void plan_buckets();
  absl::Status reserve_transient();

  // The flat range [begin, begin + count) of a unit this rank updates: stage 0 all of it, else its slice.
  std::pair<int64_t, int64_t> own_range(const UnitState& u) const;
  absl::Status assign_params(UnitState& u, const float* values, int64_t first);
  // Host values into the engine's buffers (the way back is runtime/allocator.h's on_host): `host` (CPU)
  // converted into `dst` wherever it lives.
  absl::Status upload(const Tensor& dst, const Tensor& host);
  // Checkpoints: writing this rank's file; what this rank needs of each unit (zeroed host buffers); and
  // putting what was read in place (the parameters are allgathered where the stage keeps them whole).
  absl::Status write_checkpoint_file(const std::string& path, const std::map<std::string, std::string>& extra);
  absl::StatusOr<std::vector<UnitCheckpoint>> checkpoint_targets();
  // How this rank's range of every unit is cut at stages 1-3 (world size, flat units and their padded
  // sizes): a checkpoint saved with the same layout has all of rank r's range in rank r's file. "" at
  // stage 0, where each rank updates everything.
  std::string checkpoint_layout() const;
  absl::Status install_checkpoint(const std::vector<UnitCheckpoint>& units);
  Tensor full_params(int u) const;
  ParamViews param_views(int u) const;
  // Whether this micro-batch's gradients are reduced (always, but the last one only under no_sync).
  bool reduces_this_micro_batch() const;
  // Views into the bucket staging when reducing; under no_sync otherwise, into the local gradients.
  absl::StatusOr<ParamViews> grad_views(int u);
  absl::StatusOr<Tensor> staging_of(int u);

  absl::Status acquire(int u);
  // Frees the gathered copies unit u used, but those among the `upcoming` gathers' first max_live_units.
  void release(int u, std::span<const int> upcoming);
  absl::Status ensure_gathered(int u);
  absl::Status gather_now(int u);
  // Waits for the unit's gather in flight, if any.
  absl::Status finish_gather(UnitState& u);
  absl::Status start_gather(int u);
  // The gathers the recorded order says come next in this step (none once the step has left it).
  std::span<const int> upcoming_gathers() const;
  absl::Status prefetch(std::span<const int> upcoming);
  // Which units take part in this micro-batch (Unit::runs); an error if the first or last would not.
  absl::StatusOr<std::vector<bool>> units_that_run(const UnitContext& ctx) const;
  absl::Status release_all_gathers();
  int live_gathers() const;

  absl::Status grads_ready(int u);
  absl::Status launch_reduction(Bucket& bucket);
  absl::Status finish_reduction(Bucket& bucket);
  // This rank's slice (S) of a unit's reduced gradient, and the part of it the optimizer updates.
  Tensor grad_slice(const UnitState& u) const;
  Tensor own_grads(const UnitState& u) const;
  absl::StatusOr<double> global_grad_norm();
  absl::Status update(float lr, double clip_coefficient);
  absl::Status update_unit(UnitState& u, float lr, double clip_coefficient);
  void adjust_loss_scale(bool overflow);

  template <typename F>
  Work counted(int64_t CommVolume::*purpose, F&& issue);
  // Waits for `work` on the compute thread, adding the time blocked to PhaseTimes::waiting inside a phase.
  absl::Status wait_for(Work& work);
  // ZeroConfig::time_phases: a phase opens, and closes adding its time (the device synchronized at both).
  absl::Status start_phase();
  absl::Status end_phase(absl::Duration PhaseTimes::*phase);

  Model& model_;
  std::unique_ptr<WrappedModel> wrapped_;  // the units as flattened: the model's, small runs merged
  Communicator& comm_;
  Allocator& allocator_;
  const ZeroConfig config_;
  std::vector<UnitState> units_;
  std::vector<Bucket> buckets_;
  CommVolume volume_;
  PhaseTimes phase_times_;
  absl::Time phase_start_;
  bool phase_open_ = false;  // waits count as PhaseTimes::waiting only while a phase is open

  // Stage 3 gather order: recorded on a step, replayed (with prefetch) on the next ones.
  std::vector<int> recorded_order_;
  std::vector<int> this_step_order_;
  bool order_matches_ = false;

  const DType dtype_;
  const Device device_;  // config_.device
  double loss_scale_ = 1;
  int good_steps_ = 0;
  int hysteresis_left_ = 0;

  int micro_batches_done_ = 0;
  int64_t step_count_ = 0;
  double loss_sum_ = 0;
  int64_t correct_ = 0;
  int64_t predictions_ = 0;
};

}  // namespace zero
