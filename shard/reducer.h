// Gradient reduction: buckets filled by backward, reduced as they complete, added into what the stage holds.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "shard/config.h"
#include "shard/meter.h"
#include "shard/unit_state.h"

namespace zero {

// A micro-batch's backward writes each unit's gradient into its bucket's staging (comm_buffers), which is
// scaled by 1/(N·accumulation_steps) and reduced as soon as the bucket's last unit is done: allreduced
// where every rank updates everything (stage 0), else reduce-scattered in place, one unit per bucket
// (ZeroConfig::gradient_buckets). One reduction stays in flight behind the compute; older ones are
// finished: waited for, added into the gradients the unit holds (all of them, or this rank's slice),
// and their staging freed. Under no_sync (stages 0-1) micro-batches but the last add into the held
// gradients directly, and the last one's staging starts from them. One rank holding all its gradients, one
// micro-batch a step, has nothing to scale or reduce: its backward adds into the held gradients directly, as
// under no_sync, with no staging (as DDP skips its buckets on one process).
//
// Every rank must make the same calls: each reduction is a collective. Used from the compute thread
// only.
class GradientReducer {
 public:
  // Called with a unit's index once the step's last reduction of its gradient is added into the held gradients,
  // or, adding there directly, once its backward is done (queued on the device): from then on they hold the step's
  // gradient.
  using GradientsFinal = std::function<absl::Status(int unit)>;

  GradientReducer(const RankContext& rank, const ZeroConfig& config, GradientsFinal on_final = nullptr);
  ~GradientReducer();  // waits for the reductions in flight: none may write into freed memory

  // Before a micro-batch's backward: whether it is the step's last (under no_sync, the one reduced).
  void begin_micro_batch(bool last_of_step);
  // The views unit i's backward adds its gradients into, its tied parameters' included.
  absl::StatusOr<ParamViews> grad_views(int i);
  // Unit i's backward is done, or it sat the micro-batch out (its zero gradient still joins its bucket,
  // so every rank issues the same reductions).
  absl::Status backward_done(int i);
  // Waits for every reduction of the micro-batch and adds it into the held gradients.
  absl::Status finish();
  // After the update: the held gradients start the next step at zero.
  absl::Status zero_grads();

  // The most elements of bucket staging alive at once: a tied owner's bucket lives through the whole
  // backward beside the one being filled, so the two largest.
  int64_t most_live_numel() const;

 private:
  // Consecutive units (in backward order) whose gradients are reduced by one collective.
  struct Bucket {
    std::vector<int> units;
    int64_t numel = 0;
    Buffer staging;  // (numel), comm_buffers, alive from the first gradient written until reduced
    int remaining = 0;
    std::optional<Work> reduction;
  };
  // Where a unit's gradient sits in its bucket.
  struct Place {
    int bucket = 0;
    int64_t offset = 0;
  };

  absl::StatusOr<Tensor> staging_of(int i);  // (P): unit i's part of its bucket, zeroed when first asked
  absl::Status launch(Bucket& b);
  absl::Status finish(Bucket& b);

  const RankContext rank_;
  std::vector<UnitState>& units_;  // rank_.units
  const bool allreduce_;           // StagePolicy::updates_everything
  const int accumulation_steps_;
  const bool direct_;  // !ZeroConfig::stages_gradients: the backward adds into the held gradients
  const bool no_sync_;
  std::vector<Bucket> buckets_;
  std::vector<Place> places_;  // per unit
  const GradientsFinal on_final_;
  bool reducing_ = true;      // this micro-batch's gradients are reduced
  bool last_of_step_ = true;  // this micro-batch is the step's last
};

}  // namespace zero
