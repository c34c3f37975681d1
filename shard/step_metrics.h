// The step's loss, accuracy and prediction count: each micro-batch's, from the host or from its loss kernel's sums
// left on the device (copied back once per step), summed in micro-batch order, then over ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "runtime/device_api.h"
#include "shard/meter.h"
#include "shard/module.h"

namespace zero {

// Used by the engine from its compute thread.
class StepMetrics {
 public:
  // One sizeof(kernels::LossSums) slot per micro-batch of a step, on `device`.
  static absl::StatusOr<StepMetrics> create(Allocator& allocator, Device device, int micro_batches);

  // The slot micro-batch m's loss kernel may leave its sums in (UnitContext::loss_sums).
  Tensor slot(int m) const;
  // Micro-batch ctx's, after its forward: its slot when the unit wrote it (loss_sums_written), else its loss and
  // correct count.
  void record(const UnitContext& ctx);
  // Queues the copy of the slots to the host behind the step's last kernels, without waiting: the step's next wait
  // for the device (its gradient norm) also brings them, so reduce() need not wait again.
  absl::Status copy_back();
  struct Reduced {
    float loss = 0;  // the mean over micro-batches and ranks
    int64_t correct = 0;
    int64_t predictions = 0;
  };
  // Waits for the copy unless it is done, sums the micro-batches in order, then over the ranks (a collective);
  // then starts over.
  absl::StatusOr<Reduced> reduce(CommMeter& meter, Communicator& comm);

 private:
  struct MicroBatch {
    bool on_device = false;  // loss and correct are in its slot
    float loss = 0;
    int64_t correct = 0;
    int64_t predictions = 0;
  };
  // On a device: the slots' host copy and the event after the copy into it.
  struct HostCopy {
    DeviceApi* api;
    PinnedBuffer pinned;
    OwnedEvent copied;
  };
  StepMetrics(Buffer slots, std::optional<HostCopy> host_copy)
      : slots_(std::move(slots)), host_copy_(std::move(host_copy)) {}
  // The slots on the host, once the copy is done.
  absl::StatusOr<const void*> slots_on_host();

  Buffer slots_;
  std::optional<HostCopy> host_copy_;  // none on the CPU, where the slots are host memory
  std::vector<MicroBatch> micro_batches_;
};

}  // namespace zero
