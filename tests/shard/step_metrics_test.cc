// StepMetrics: losses from device slots and from the host summed in micro-batch order, the device waited for at most
// once, and no copy left in flight when the metrics go.
#include "shard/step_metrics.h"

#include <functional>

#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "runtime/comm/local.h"
#include "runtime/device_memory.h"
#include "runtime/sim/sim_api.h"
#include "runtime/status.h"

namespace zero {
namespace {

constexpr Device kSim = Device::sim(0);

// Micro-batch `ctx` as a loss unit leaves it: sums in its slot on the device, or its loss on the host.
absl::Status leave_in_slot(UnitContext& ctx, const kernels::LossSums& sums, int64_t predictions) {
  ZERO_RETURN_IF_ERROR(copy_bytes(ctx.loss_sums.data(), kSim, &sums, Device::cpu(), sizeof(sums)));
  ctx.loss_sums_written = true;
  ctx.predictions = predictions;
  return absl::OkStatus();
}

// One step's metrics of `micro_batches` on sim:0 in a world of one: `record` fills them, then they are copied back
// and reduced; returns the reduction and how many times the host waited for the device meanwhile.
struct ReducedStep {
  StepMetrics::Reduced reduced;
  uint64_t waits = 0;
};
absl::StatusOr<ReducedStep> reduce_step(int micro_batches,
                                        const std::function<absl::Status(StepMetrics&, Allocator&)>& record) {
  ReducedStep out;
  const absl::Status status = root_cause(run_local_ranks(1, [&](Communicator& comm) -> absl::Status {
    Allocator allocator;
    ZERO_ASSIGN_OR_RETURN(StepMetrics metrics, StepMetrics::create(allocator, kSim, micro_batches));
    CommMeter meter(comm, kSim, /*time_phases=*/false);
    ZERO_RETURN_IF_ERROR(record(metrics, allocator));
    const uint64_t before = sim_device().host_synchronizations();
    ZERO_RETURN_IF_ERROR(metrics.copy_back());
    ZERO_ASSIGN_OR_RETURN(out.reduced, metrics.reduce(meter, comm));
    out.waits = sim_device().host_synchronizations() - before;
    return absl::OkStatus();
  }));
  if (!status.ok()) return status;
  return out;
}

TEST(StepMetrics, SlotsAndHostLossesSumInOrderWithAtMostOneWait) {
  const Batch batch;
  absl::StatusOr<ReducedStep> step = reduce_step(2, [&](StepMetrics& metrics, Allocator& allocator) -> absl::Status {
    UnitContext on_device{.allocator = allocator, .batch = batch, .device = kSim, .loss_sums = metrics.slot(0)};
    ZERO_RETURN_IF_ERROR(leave_in_slot(on_device, {.loss = 3.0, .correct = 2}, 4));
    metrics.record(on_device);
    UnitContext on_host{.allocator = allocator, .batch = batch, .device = kSim, .loss_sums = metrics.slot(1)};
    on_host.loss = 0.5f;
    on_host.correct = 1;
    on_host.predictions = 2;
    metrics.record(on_host);
    return absl::OkStatus();
  });
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_LE(step->waits, 1u);
  EXPECT_EQ(step->reduced.loss, (0.75f + 0.5f) / 2);
  EXPECT_EQ(step->reduced.correct, 3);
  EXPECT_EQ(step->reduced.predictions, 6);
}

// A step that failed after queueing the copy back leaves it in flight: the pinned memory it lands in is freed only
// after it (the simulated device's checker would name a free_pinned not ordered after the copy, and stay failed).
TEST(StepMetrics, DroppedWithACopyInFlightWaitsForItBeforeFreeing) {
  {
    Allocator allocator;
    absl::StatusOr<StepMetrics> metrics = StepMetrics::create(allocator, kSim, 1);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    const Batch batch;
    UnitContext ctx{.allocator = allocator, .batch = batch, .device = kSim, .loss_sums = metrics->slot(0)};
    ASSERT_TRUE(leave_in_slot(ctx, {.loss = 1.0, .correct = 1}, 1).ok());
    metrics->record(ctx);
    ASSERT_TRUE(metrics->copy_back().ok());
  }
  const absl::Status device = sim_device().synchronize_device(0);
  EXPECT_TRUE(device.ok()) << device;
}

// Where every unit set its loss on the host, nothing is copied back and nothing waited for.
TEST(StepMetrics, LossesSetOnTheHostNeedNoCopyNorWait) {
  const Batch batch;
  absl::StatusOr<ReducedStep> step = reduce_step(1, [&](StepMetrics& metrics, Allocator& allocator) -> absl::Status {
    UnitContext ctx{.allocator = allocator, .batch = batch, .device = kSim, .loss_sums = metrics.slot(0)};
    ctx.loss = 2.0f;
    ctx.predictions = 1;
    metrics.record(ctx);
    return absl::OkStatus();
  });
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->waits, 0u);
  EXPECT_EQ(step->reduced.loss, 2.0f);
}

}  // namespace
}  // namespace zero
