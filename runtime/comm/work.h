// A handle to an asynchronous collective: wait for it, or ask whether it finished.
#pragma once

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device_api.h"

namespace zero {

// Where a device collective's work ends on the device: an event of `device`, recorded after it.
struct DeviceCompletion {
  Device device;
  OwnedEvent event;
};

// Shared between the Work handles and the thread that completes the operation. Thread-safe.
class WorkState {
 public:
  // `on_device` is shared with the thread that settles the collective (Communicator's watchdog).
  void complete(absl::Status status, std::shared_ptr<const DeviceCompletion> on_device = nullptr);
  // The status, once complete; a device collective's also orders the calling thread's current stream after what it
  // queued, failed or not.
  absl::Status wait();
  bool is_completed();

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const DeviceCompletion> on_device_ ABSL_GUARDED_BY(mu_);
};

// Copies share one operation; any copy may be waited on or polled, from any thread, any number of times.
// A Work may outlive its Communicator: destroying the communicator finishes pending work first, so a
// later wait() returns at once. Dropping a Work does not cancel the operation: its host buffers must stay valid
// until it has run (at the latest, until the communicator's destructor returned); its device buffers until the
// device is synchronized, as nothing else orders a stream after a Work no one waited for.
class Work {
 public:
  // An already finished operation with `status`.
  static Work completed(absl::Status status = absl::OkStatus());
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

  // Blocks until the operation finished (or failed: it fails on its own within the communicator's
  // timeout) and returns its status. Host buffers may be reused only after wait() returned. On device buffers the
  // operation is finished once queued on the device, and wait() makes the calling thread's current stream wait for
  // its end there (as c10d's work.wait()): the kernels queued on that stream next read its output, and a free
  // queued there comes after it. A failure found after it was queued (Backend::settle) is not this Work's: the
  // later collectives, and Communicator::flush, return it.
  absl::Status wait() const { return state_->wait(); }
  // Whether wait() would return at once: finished, or on device buffers queued.
  bool is_completed() const { return state_->is_completed(); }

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace zero
