// CommMeter: bytes by purpose, and phase and wait times on the compute thread.
#include "shard/meter.h"

#include "runtime/device_memory.h"
#include "runtime/status.h"

namespace zero {

Work CommMeter::counted(int64_t CommVolume::*purpose, absl::FunctionRef<Work()> issue) {
  const int64_t before = comm_.stats().total_sent_bytes();
  Work work = issue();
  volume_.*purpose += comm_.stats().total_sent_bytes() - before;
  return work;
}

absl::Status CommMeter::wait(Work& work) {
  if (!phase_open_) return work.wait();  // not timing, or outside a step (evaluate, export)
  const absl::Time start = absl::Now();
  absl::Status status = work.wait();
  phase_times_.waiting += absl::Now() - start;
  return status;
}

absl::Status CommMeter::open_phase() {
  if (!time_phases_) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(synchronize(device_));
  phase_start_ = absl::Now();
  phase_open_ = true;
  return absl::OkStatus();
}

absl::Status CommMeter::close_phase(absl::Duration PhaseTimes::*phase) {
  if (!phase_open_) return absl::OkStatus();
  phase_open_ = false;
  ZERO_RETURN_IF_ERROR(synchronize(device_));
  phase_times_.*phase += absl::Now() - phase_start_;
  return absl::OkStatus();
}

}  // namespace zero
