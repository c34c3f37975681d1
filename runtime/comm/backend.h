// The transport under a Communicator: runs one collective at a time on the comm thread, a host one to completion, a
// device one until queued on the device (settled then on the watchdog thread).
#pragma once

#include <span>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/comm/collective.h"
#include "runtime/device_api.h"

namespace zero {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual absl::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual bool supports(Device device) const { return device.is_cpu(); }
  // Where this rank's training buffers belong: the CPU, or the backend's own GPU (nccl).
  virtual Device home_device() const { return Device::cpu(); }

  // Called on the thread that posts `c`, before it is queued: where a backend of device buffers orders `c` after the
  // kernels that thread already enqueued on its current stream (which write its inputs), without waiting for them
  // (PostEvents).
  virtual absl::Status prepare(const Collective& c) {
    (void)c;
    return absl::OkStatus();
  }

  // The stream a device collective's work is queued on: once run() returned, an event recorded there marks its end,
  // which Work::wait makes the waiter's current stream wait for.
  virtual Stream stream_for(const Collective& c) const { return Stream::legacy(c.device.index); }

  // Runs `c`: a host collective to completion; a device collective until its work is queued on stream_for(c).
  // Arguments are already validated. Must give up with DeadlineExceeded (naming the ranks it waited for, where it
  // can tell) at `deadline`, and fail promptly once a peer failed.
  virtual absl::Status run(const Collective& c, absl::Time deadline) = 0;

  // Called on the communicator's watchdog thread, in posting order, after run() queued device collective `c` and its
  // Work completed, while the comm thread runs the collectives after it: where a backend whose queued work can still
  // fail or stall (NCCL, on a peer's failure) waits until `end` (recorded after `c` on stream_for(c)) has happened,
  // within `deadline`, watching for errors. So it runs beside run() and abort(), and must be safe to. An error fails
  // the communicator, and so the collectives the comm thread starts after.
  virtual absl::Status settle(const Collective& c, Event end, absl::Time deadline) {
    (void)c;
    (void)end;
    (void)deadline;
    return absl::OkStatus();
  }

  // Fills `all[r]` with rank r's fingerprint (the debug check). The default runs a host allgather.
  virtual absl::Status exchange_fingerprints(const CollectiveFingerprint& mine, std::span<CollectiveFingerprint> all,
                                             absl::Time deadline);

  // Called once, after this rank's first failure (from the comm or the watchdog thread), so peers blocked in a
  // collective with us fail too, and so does what this rank still has queued.
  virtual void abort(const absl::Status& cause) { (void)cause; }
};

}  // namespace zero
