// Where each device collective was posted: an event on the posting thread's current stream, which the stream that
// runs the collective waits for, so it reads what the kernels enqueued before the post wrote and waits for nothing
// posted after.
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "runtime/comm/collective.h"
#include "runtime/device_api.h"

namespace zero {

// Thread-safe: record() runs on the posting thread (Backend::prepare), wait() on the comm thread (Backend::run), in
// the same order, one each per device collective (after a failure the collectives that never run leave theirs).
class PostEvents {
 public:
  // On the calling thread's current stream of `c.device`; nothing for a host collective.
  absl::Status record(const Collective& c);
  // Makes `stream` wait for the event record() made for `c` (the oldest not yet waited for); nothing for a host one.
  absl::Status wait(Stream stream, const Collective& c);

 private:
  absl::StatusOr<OwnedEvent> spare_event(Device device);

  struct Posted {
    Device device;
    OwnedEvent event;
  };
  absl::Mutex mu_;
  std::deque<Posted> posted_ ABSL_GUARDED_BY(mu_);  // recorded, not yet waited for
  std::vector<Posted> spare_ ABSL_GUARDED_BY(mu_);  // waited for: recycled
};

}  // namespace zero
