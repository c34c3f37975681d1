// GradientReducer: bucket staging, the reductions in flight, no_sync, and the adds into the held gradients.
#include "shard/reducer.h"

#include "kernels/kernels.h"
#include "runtime/status.h"
#include "shard/stage.h"

namespace zero {

GradientReducer::GradientReducer(const RankContext& rank, const ZeroConfig& config, GradientsFinal on_final)
    : rank_(rank), units_(rank.units), allreduce_(StagePolicy(config.stage).updates_everything()),
      accumulation_steps_(config.accumulation_steps), direct_(!config.stages_gradients(rank.comm.world_size())),
      no_sync_(config.no_sync), places_(units_.size()), on_final_(std::move(on_final)) {
  std::vector<int64_t> padded_numels;
  for (const UnitState& u : units_) padded_numels.push_back(u.layout.padded_numel);
  for (std::vector<int>& members : config.gradient_buckets(padded_numels)) {
    Bucket bucket;
    for (const int i : members) {
      places_[i] = {.bucket = static_cast<int>(buckets_.size()), .offset = bucket.numel};
      bucket.numel += units_[i].layout.padded_numel;
    }
    bucket.remaining = static_cast<int>(members.size());
    bucket.units = std::move(members);
    buckets_.push_back(std::move(bucket));
  }
}

GradientReducer::~GradientReducer() {
  for (Bucket& b : buckets_) {
    if (b.reduction) (void)b.reduction->wait();
  }
}

void GradientReducer::begin_micro_batch(bool last_of_step) {
  reducing_ = !direct_ && (!no_sync_ || last_of_step);
  last_of_step_ = last_of_step;
}

absl::StatusOr<ParamViews> GradientReducer::grad_views(int i) {
  // (P) per unit: its bucket's staging, or, not reducing (no_sync, or direct_), the held gradients (stages 0-1 hold
  // all of them).
  return unit_views(units_, i, [&](int owner) -> absl::StatusOr<Tensor> {
    if (reducing_) return staging_of(owner);
    return units_[owner].held_grads(rank_.dtype);
  });
}

absl::Status GradientReducer::backward_done(int i) {
  // Direct, unit i's gradient is final: the units whose tied parameters it owns come after it, so their backward ran.
  if (!reducing_) return direct_ && on_final_ ? on_final_(i) : absl::OkStatus();
  ZERO_RETURN_IF_ERROR(staging_of(i).status());  // a unit that sat out joins its bucket with zeros
  Bucket& b = buckets_[places_[i].bucket];
  if (--b.remaining > 0) return absl::OkStatus();
  b.remaining = static_cast<int>(b.units.size());
  ZERO_RETURN_IF_ERROR(launch(b));
  // Keep one reduction in flight behind the backward compute; finish (and free) the older ones.
  for (Bucket& older : buckets_) {
    if (&older == &b) break;
    ZERO_RETURN_IF_ERROR(finish(older));
  }
  return absl::OkStatus();
}

absl::Status GradientReducer::finish() {
  for (Bucket& b : buckets_) ZERO_RETURN_IF_ERROR(finish(b));
  return absl::OkStatus();
}

absl::Status GradientReducer::zero_grads() {
  for (UnitState& u : units_) ZERO_RETURN_IF_ERROR(kernels::fill_zero(u.grads.tensor(DType::kU8, {u.grads.nbytes()})));
  return absl::OkStatus();
}

int64_t GradientReducer::most_live_numel() const {
  if (direct_) return 0;
  std::vector<int64_t> sizes;
  for (const Bucket& b : buckets_) sizes.push_back(b.numel);
  return sum_of_largest(std::move(sizes), 2);
}

absl::StatusOr<Tensor> GradientReducer::staging_of(int i) {
  const UnitState& u = units_[i];
  const Place place = places_[i];
  Bucket& b = buckets_[place.bucket];
  if (b.staging.data() == nullptr && b.numel > 0) {
    const int64_t bytes = b.numel * static_cast<int64_t>(dtype_size(rank_.dtype));
    ZERO_ASSIGN_OR_RETURN(b.staging, rank_.allocator.allocate(bytes, MemoryCategory::kCommBuffers, rank_.device));
    const Tensor staging = b.staging.tensor(rank_.dtype, {b.numel});
    ZERO_RETURN_IF_ERROR(kernels::fill_zero(staging));
    // no_sync: the micro-batches so far accumulated in the held gradients; they join the reduction.
    if (no_sync_) {
      for (const int k : b.units) {
        const int64_t offset = places_[k].offset;
        const Tensor grads = units_[k].held_grads(rank_.dtype);
        ZERO_RETURN_IF_ERROR(kernels::cast(staging.slice(offset, offset + units_[k].layout.padded_numel), grads));
        ZERO_RETURN_IF_ERROR(kernels::fill_zero(grads));
      }
    }
  }
  return b.staging.tensor(rank_.dtype, {b.numel}).slice(place.offset, place.offset + u.layout.padded_numel);
}

absl::Status GradientReducer::launch(Bucket& b) {
  if (b.numel == 0) return absl::OkStatus();
  const Tensor all = b.staging.tensor(rank_.dtype, {b.numel});
  ZERO_RETURN_IF_ERROR(kernels::divide_by(all, static_cast<float>(rank_.comm.world_size() * accumulation_steps_)));
  if (allreduce_) {
    b.reduction =
        rank_.meter.counted(&CommVolume::grad_reduce, [&] { return rank_.comm.allreduce(all, ReduceOp::kSum); });
    return absl::OkStatus();
  }
  // One unit per bucket: reduce-scatter in place, each rank's slice landing where it was.
  const UnitState& u = units_[b.units[0]];
  const Tensor slice = all.slice(u.slice_begin, u.slice_begin + u.layout.shard_numel);
  b.reduction = rank_.meter.counted(&CommVolume::grad_reduce,
                                    [&] { return rank_.comm.reduce_scatter(all, slice, ReduceOp::kSum); });
  return absl::OkStatus();
}

absl::Status GradientReducer::finish(Bucket& b) {
  if (!b.reduction) return absl::OkStatus();
  absl::Status s = rank_.meter.wait(*b.reduction);
  b.reduction.reset();
  ZERO_RETURN_IF_ERROR(s);
  const Tensor staging = b.staging.tensor(rank_.dtype, {b.numel});
  for (const int i : b.units) {
    const UnitState& u = units_[i];
    const int64_t offset = places_[i].offset;
    const Tensor reduced = staging.slice(offset, offset + u.layout.padded_numel);
    // Where every rank updates everything, all of the reduced gradient; else this rank's slice of it.
    if (allreduce_) {
      ZERO_RETURN_IF_ERROR(kernels::add_into(u.held_grads(rank_.dtype), reduced));
    } else {
      const Tensor slice = reduced.slice(u.slice_begin, u.slice_begin + u.layout.shard_numel);
      ZERO_RETURN_IF_ERROR(kernels::add_into(u.grad_slice(rank_.dtype), slice));
    }
    if (last_of_step_ && on_final_) ZERO_RETURN_IF_ERROR(on_final_(i));
  }
  b.staging.reset();
  return absl::OkStatus();
}

}  // namespace zero
