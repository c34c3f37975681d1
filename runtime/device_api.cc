// What every DeviceApi shares: a tensor seen through a launch's host pointers, deadline-bounded waits, and ordering
// after the legacy default stream.
#include "runtime/device_api.h"

#include <algorithm>
#include <thread>

#include "runtime/status.h"

namespace zero {

absl::StatusOr<Tensor> LaunchContext::host_tensor(const Tensor& t) const {
  // No memory behind it (Tensor(), or an empty allocation): nothing to re-point, but it is on the CPU now, so a
  // body passing it to a public kernel takes the CPU path rather than launching again from inside the launch.
  if (t.data() == nullptr) return Tensor(nullptr, t.dtype(), t.shape(), t.strides(), Device::cpu());
  ZERO_ASSIGN_OR_RETURN(void* data, host_pointer(t.data(), t.nbytes()));
  return Tensor(data, t.dtype(), t.shape(), t.strides(), Device::cpu());
}

absl::Status synchronize_until(DeviceApi& api, Event event, absl::Time deadline,
                               const std::function<absl::Status()>& check) {
  absl::Duration pause = absl::ZeroDuration();
  for (;;) {
    ZERO_ASSIGN_OR_RETURN(const bool done, api.query(event));
    if (done) return absl::OkStatus();
    if (check) ZERO_RETURN_IF_ERROR(check());
    if (absl::Now() >= deadline)
      return absl::DeadlineExceededError("the device work did not finish before the deadline");
    if (pause == absl::ZeroDuration()) {
      std::this_thread::yield();
      pause = absl::Microseconds(1);
    } else {
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Milliseconds(1));
    }
  }
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::allocate(DeviceApi& api, size_t bytes) {
  PinnedBuffer pinned;
  if (bytes == 0) return pinned;
  ZERO_ASSIGN_OR_RETURN(pinned.data_, api.allocate_pinned(bytes));
  pinned.api_ = &api;
  pinned.bytes_ = bytes;
  return pinned;
}

absl::Status wait_for_legacy_stream(DeviceApi& api, Stream stream, Event marker) {
  ZERO_RETURN_IF_ERROR(api.record(marker, Stream::legacy(stream.device)));
  return api.wait(stream, marker);
}

}  // namespace zero
