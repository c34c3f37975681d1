// ZeRO-Offload (ZeroConfig::offload_optimizer_to_host): a device engine's optimizer stepping on the host.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/allocator.h"
#include "runtime/device_api.h"
#include "shard/unit_state.h"

namespace zero {

// The transfers of the update of units whose parameters and gradients live on a device and whose fp32 master
// weights and optimizer live on the CPU (the engine steps the optimizer between them). Per unit, in the training
// dtype (own_count elements each), two page-locked buffers: the gradient, streamed out by gradients_final as soon as
// the unit's last reduction of the step has been added in, on a transfer stream of its own so that the copy
// overlaps the rest of backward; and the updated parameters, streamed back by send_parameters. The compute
// stream (current), where the kernels run, waits on the device for each parameter copy; the host waits only for a
// gradient it is about to read, or for the previous step's parameter copy before writing the buffer again.
//
//   own grads (device) --gradients_final--> gradients(i) (pinned) --the CPU optimizer, unscaling and clipping-->
//   parameters(i) (pinned) --send_parameters--> own params (device)
//
// A unit whose parameter shard lives in host memory itself (ZeroConfig::offload_param_to_host) is updated in place:
// parameters(i) is the shard, and send_parameters has nothing to copy.
//
// Used from the compute thread, but for streamed_gradients and parameters, which the delayed update calls from a
// thread of its own for the units the compute thread leaves alone meanwhile; `units` must outlive it.
class HostOffload {
 public:
  // The pinned buffers come from `allocator` (MemoryStats::pinned_*), which must outlive the HostOffload.
  static absl::StatusOr<HostOffload> create(std::vector<UnitState>& units, DType dtype, Device device,
                                            Allocator& allocator);
  HostOffload(HostOffload&&) = default;
  HostOffload& operator=(HostOffload&&) = default;
  // Waits for the copies in flight, which read or write the pinned buffers it frees.
  ~HostOffload();

  // Unit i's gradient for this step is complete, as queued on the device so far: its copy to the host starts.
  absl::Status gradients_final(int i);
  // Starts the gradient copies gradients_final has not started this step: before the update reads them.
  absl::Status stream_remaining_gradients();
  // Unit i's gradient on the host (own_count, training dtype, pinned), once its copy (started) finished.
  absl::StatusOr<Tensor> streamed_gradients(int i) const;
  // Where the update writes unit i's parameters (own_count, training dtype): pinned memory, once the last copy from it
  // finished, or the unit's own parameters where they are in host memory.
  absl::StatusOr<Tensor> parameters(int i);
  // Before the update writes shards in host memory (offload_param_to_host) through parameters(): waits once for the
  // current stream, where their copies to the device were queued (a gather's staging, a prefetch the step did not
  // use included). Nothing where no shard is in host memory.
  absl::Status wait_for_shard_copies();
  // Copies parameters(i) into unit i's own parameters on the device, ahead of every kernel queued after this call.
  absl::Status send_parameters(int i);
  // Kernels queued from now on (zeroing the gradients for the next step) wait for every gradient copy of this step:
  // after the update, or in its place for a skipped fp16 step.
  absl::Status release_gradients();

 private:
  bool params_on_host(int i) const { return (*units_)[i].params.device().is_cpu(); }

  struct PerUnit {
    Buffer grads_out;       // (own_count) training dtype, pinned
    Buffer params_in;       // (own_count) training dtype, pinned; none where the params are in host memory
    OwnedEvent copied_out;  // the gradient's copy to grads_out
    OwnedEvent copied_in;   // the parameters' copy from params_in
    bool streamed = false;  // gradients_final ran this step, and the kernels have not waited for its copy yet
  };
  HostOffload(std::vector<UnitState>& units, DType dtype, Device device, DeviceApi& api, OwnedStream transfer,
              OwnedEvent compute_marker, std::vector<PerUnit> per_unit);

  std::vector<UnitState>* units_;
  DType dtype_;
  Device device_;
  DeviceApi* api_;
  OwnedStream transfer_;       // non-blocking: ordered with the kernels by events alone
  OwnedEvent compute_marker_;  // where a transfer waits for the compute stream's work queued before it
  std::vector<PerUnit> per_unit_;
};

}  // namespace zero
