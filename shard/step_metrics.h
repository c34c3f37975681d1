// The step's loss, accuracy and prediction count: each micro-batch's, from the host or from its loss kernel's sums
// left on the device (copied back once per step), summed in micro-batch order, then over ranks.
#pragma once

#include <cstdint>
#include <memory>
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
  // Micro-batch ctx's, once its forward and backward ran: its slot when the unit wrote it (loss_sums_written), else
  // its loss and correct count.
  void record(const UnitContext& ctx);
  // Where a micro-batch left its sums in a slot, queues the copy of the slots to the host behind the step's last
  // kernels, without waiting: the step's next wait for the device (its gradient norm) also brings them, so
  // reduce() need not wait again.
  absl::Status copy_back();
  struct Reduced {
    float loss = 0;  // the mean over micro-batches and ranks
    int64_t correct = 0;
    int64_t predictions = 0;
  };
  // Waits for the copy unless it is done, sums the micro-batches in order, then over the ranks (a collective);
  // then, having succeeded, starts over.
  absl::StatusOr<Reduced> reduce(CommMeter& meter, Communicator& comm);

 private:
  struct MicroBatch {
    bool on_device = false;  // loss and correct are in its slot
    float loss = 0;
    int64_t correct = 0;
    int64_t predictions = 0;
  };
  // On a device: the slots' host copy, and the event after the copy into it. Its memory is freed only once a
  // copy still queued has landed (a failed step may leave one behind).
  struct HostCopy {
    HostCopy(DeviceApi& api, PinnedBuffer pinned, OwnedEvent copied)
        : api(api), pinned(std::move(pinned)), copied(std::move(copied)) {}
    HostCopy(const HostCopy&) = delete;
    HostCopy& operator=(const HostCopy&) = delete;
    ~HostCopy() {
      if (queued) (void)api.synchronize(copied.get());
    }
    // The pinned slots, once the copy is done: a query, and a wait only if it is not.
    absl::StatusOr<const void*> landed();

    DeviceApi& api;
    PinnedBuffer pinned;
    OwnedEvent copied;
    bool queued = false;  // a copy was queued and not yet waited for
  };
  StepMetrics(Buffer slots, std::unique_ptr<HostCopy> host_copy)
      : slots_(std::move(slots)), host_copy_(std::move(host_copy)) {}
  bool any_on_device() const;

  Buffer slots_;
  std::unique_ptr<HostCopy> host_copy_;  // none on the CPU, where the slots are host memory
  std::vector<MicroBatch> micro_batches_;
};

}  // namespace zero
