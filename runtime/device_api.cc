// What every DeviceApi shares: a tensor seen through a launch's host pointers, deadline-bounded waits, and ordering
// after the legacy default stream.
#include "runtime/device_api.h"

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

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

absl::Status order_after(DeviceApi& api, Stream later, Stream earlier, Event marker) {
  ZERO_RETURN_IF_ERROR(api.record(marker, earlier));
  return api.wait(later, marker);
}

absl::Status copy_in_order_of(DeviceApi& api, Stream stream, void* dst, const void* src, size_t bytes) {
  const Stream legacy = Stream::legacy(stream.device);
  if (stream == legacy) return api.copy(dst, src, bytes);
  ZERO_ASSIGN_OR_RETURN(OwnedEvent marker, OwnedEvent::create(api, stream.device));
  ZERO_RETURN_IF_ERROR(order_after(api, legacy, stream, marker.get()));
  ZERO_RETURN_IF_ERROR(api.copy(dst, src, bytes));
  return order_after(api, stream, legacy, marker.get());
}

namespace {

// The calling thread's scoped streams: one entry per device a StreamScope is open on (a handful at most).
std::vector<std::pair<Device, Stream>>& scoped_streams() {
  thread_local std::vector<std::pair<Device, Stream>> streams;
  return streams;
}

std::vector<std::pair<Device, Stream>>::iterator scoped_entry(Device device) {
  auto& streams = scoped_streams();
  return std::find_if(streams.begin(), streams.end(), [&](const auto& entry) { return entry.first == device; });
}

}  // namespace

Stream current_stream(Device device) {
  const auto it = scoped_entry(device);
  return it != scoped_streams().end() ? it->second : Stream::legacy(device.index);
}

StreamScope::StreamScope(Device device, std::optional<Stream> stream) : device_(device) {
  if (!stream.has_value()) return;
  ZERO_CHECK(!device.is_cpu() && stream->device == device.index, "a StreamScope on ", device.to_string(),
             " with a stream of device ", stream->device);
  active_ = true;
  const auto it = scoped_entry(device);
  if (it != scoped_streams().end()) {
    previous_ = std::exchange(it->second, *stream);
  } else {
    scoped_streams().emplace_back(device, *stream);
  }
}

JoinedStreamScope::JoinedStreamScope(DeviceApi* api, Device device, std::optional<Stream> stream, Event marker)
    : api_(api), caller_(device.is_cpu() ? Stream{} : current_stream(device)), stream_(stream), marker_(marker),
      scope_(device, stream) {
  if (joined()) status_ = order_after(*api_, *stream_, caller_, marker_);
}

JoinedStreamScope::~JoinedStreamScope() {
  // An error here is a device failure, sticky: the next call on the device reports it.
  if (joined() && status_.ok()) (void)order_after(*api_, caller_, *stream_, marker_);
}

bool JoinedStreamScope::joined() const { return stream_.has_value() && *stream_ != caller_; }

StreamScope::~StreamScope() {
  if (!active_) return;
  const auto it = scoped_entry(device_);
  ZERO_CHECK(it != scoped_streams().end(), "a StreamScope on ", device_.to_string(), " ended out of order");
  if (previous_.has_value()) {
    it->second = *previous_;
  } else {
    scoped_streams().erase(it);
  }
}

}  // namespace zero
