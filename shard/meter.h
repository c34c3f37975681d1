// What the engine's collectives cost a rank: bytes sent by purpose, and (time_phases) time per phase.
#pragma once

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/comm/communicator.h"
#include "runtime/device.h"

namespace zero {

// Bytes this rank sent, by purpose.
struct CommVolume {
  int64_t param_gather = 0;  // stage 3 gathers, stage 1-3 parameter allgathers after the update
  int64_t grad_reduce = 0;   // bucket allreduces and reduce-scatters
  int64_t small = 0;         // loss, metrics and gradient-norm allreduces
};

// Wall time of this rank's compute thread per phase, summed over steps (ZeroConfig::time_phases).
// `waiting` is the part of the three it spent blocked on a collective: communication that overlap did not
// hide, or a slower peer. On a device a collective's wait ends once it is queued there (under nccl, after the
// previous one settled), so communication the overlap did not hide lengthens the phase instead.
struct PhaseTimes {
  absl::Duration forward;   // the units' forward passes, with the stage-3 gathers they waited for
  absl::Duration backward;  // backward passes, gathers, and the gradient reductions to their end
  absl::Duration update;    // step(): gradient norm, optimizer, stage 1-2 parameter allgathers, metrics
  absl::Duration waiting;
};

// Issues and waits for the engine's collectives, counting their bytes and the compute thread's waits.
// Used from the compute thread only.
class CommMeter {
 public:
  // `time_phases`: phases are timed, the device synchronized at their boundaries; otherwise the phase
  // calls do nothing.
  CommMeter(Communicator& comm, Device device, bool time_phases)
      : comm_(comm), device_(device), time_phases_(time_phases) {}

  // The collective `issue` posts, its bytes added to `purpose`.
  Work counted(int64_t CommVolume::*purpose, absl::FunctionRef<Work()> issue);
  // Waits for `work`, adding the time blocked to PhaseTimes::waiting while a phase is open.
  absl::Status wait(Work& work);

  // A phase opens, and closes adding its time. A phase that is never closed (its step failed) adds
  // nothing: the next open_phase starts afresh, and waits outside a phase are not counted.
  absl::Status open_phase();
  absl::Status close_phase(absl::Duration PhaseTimes::*phase);
  void abandon_phase() { phase_open_ = false; }

  CommVolume volume() const { return volume_; }
  void reset_volume() { volume_ = {}; }
  PhaseTimes phase_times() const { return phase_times_; }
  void reset_phase_times() { phase_times_ = {}; }

 private:
  Communicator& comm_;
  const Device device_;
  const bool time_phases_;
  CommVolume volume_;
  PhaseTimes phase_times_;
  absl::Time phase_start_;
  bool phase_open_ = false;
};

}  // namespace zero
