// StepMetrics: micro-batch losses recorded, their device sums read once, reduced over ranks with exact counts.
#include "shard/step_metrics.h"

#include <algorithm>

#include "kernels/kernels.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

namespace zero {

absl::StatusOr<StepMetrics> StepMetrics::create(Allocator& allocator, Device device, int micro_batches) {
  const size_t bytes = micro_batches * sizeof(kernels::LossSums);
  ZERO_ASSIGN_OR_RETURN(Buffer slots, allocator.allocate(bytes, MemoryCategory::kWorkspace, device));
  DeviceApi* api = device_api(device);
  if (api == nullptr) return StepMetrics(std::move(slots), nullptr);
  ZERO_ASSIGN_OR_RETURN(PinnedBuffer pinned, PinnedBuffer::allocate(*api, bytes));
  ZERO_ASSIGN_OR_RETURN(OwnedEvent copied, OwnedEvent::create(*api, device.index));
  return StepMetrics(std::move(slots), std::make_unique<HostCopy>(*api, std::move(pinned), std::move(copied)));
}

Tensor StepMetrics::slot(int m) const {
  return slots_.tensor(DType::kU8, {slots_.nbytes()}).view(m * sizeof(kernels::LossSums), {sizeof(kernels::LossSums)});
}

void StepMetrics::record(const UnitContext& ctx) {
  micro_batches_.push_back(
      {.on_device = ctx.loss_sums_written, .loss = ctx.loss, .correct = ctx.correct, .predictions = ctx.predictions});
}

bool StepMetrics::any_on_device() const {
  return std::any_of(micro_batches_.begin(), micro_batches_.end(), [](const MicroBatch& b) { return b.on_device; });
}

absl::Status StepMetrics::copy_back() {
  if (!host_copy_ || !any_on_device()) return absl::OkStatus();
  // The current (compute) stream, where the kernels that wrote the slots run.
  const Stream stream = current_stream(slots_.device());
  ZERO_RETURN_IF_ERROR(host_copy_->api.copy_async(host_copy_->pinned.data(), slots_.data(), slots_.nbytes(), stream));
  ZERO_RETURN_IF_ERROR(host_copy_->api.record(host_copy_->copied.get(), stream));
  host_copy_->queued = true;
  return absl::OkStatus();
}

absl::StatusOr<const void*> StepMetrics::HostCopy::landed() {
  ZERO_ASSIGN_OR_RETURN(const bool done, api.query(copied.get()));
  if (!done) ZERO_RETURN_IF_ERROR(api.synchronize(copied.get()));
  queued = false;
  return pinned.data();
}

absl::StatusOr<StepMetrics::Reduced> StepMetrics::reduce(CommMeter& meter, Communicator& comm) {
  const void* slots = slots_.data();
  if (host_copy_ && any_on_device()) {
    ZERO_ASSIGN_OR_RETURN(slots, host_copy_->landed());
  }
  const auto* sums = static_cast<const kernels::LossSums*>(slots);
  double loss_sum = 0;
  int64_t correct = 0, predictions = 0;
  for (size_t m = 0; m < micro_batches_.size(); ++m) {
    MicroBatch& b = micro_batches_[m];
    if (b.on_device) {
      const kernels::CrossEntropyResult r = kernels::loss_of(sums[m], b.predictions);
      b.loss = r.loss;
      b.correct = r.correct;
    }
    loss_sum += b.loss;
    correct += b.correct;
    predictions += b.predictions;
  }
  const int micro_batches = static_cast<int>(micro_batches_.size());
  // The loss as fp32; the counts exactly, as integers: each split into 16-bit halves so an int32 sum over
  // ranks cannot overflow (exact up to 2^47 per step).
  float loss = static_cast<float>(loss_sum);
  int32_t counts[4] = {static_cast<int32_t>(correct >> 16), static_cast<int32_t>(correct & 0xffff),
                       static_cast<int32_t>(predictions >> 16), static_cast<int32_t>(predictions & 0xffff)};
  Work loss_reduced = meter.counted(&CommVolume::small,
                                    [&] { return comm.allreduce(Tensor(&loss, DType::kF32, {1}), ReduceOp::kSum); });
  Work counts_reduced = meter.counted(&CommVolume::small,
                                      [&] { return comm.allreduce(Tensor(counts, DType::kI32, {4}), ReduceOp::kSum); });
  absl::Status status = meter.wait(loss_reduced);
  status.Update(meter.wait(counts_reduced));
  ZERO_RETURN_IF_ERROR(status);
  micro_batches_.clear();
  return Reduced{.loss = loss / static_cast<float>(comm.world_size() * micro_batches),
                 .correct = (int64_t{counts[0]} << 16) + counts[1],
                 .predictions = (int64_t{counts[2]} << 16) + counts[3]};
}

}  // namespace zero
