// The one device interface: streams, events, stream-ordered memory, copies and kernel launches, with CUDA's
// ordering rules. CUDA (runtime/cuda/cuda_api.cc) and the simulated device (runtime/sim/) implement it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

namespace zero {

// A queue of device work on one device; id 0 is that device's legacy default stream, which CUDA names by
// no stream at all. Plain handles: the DeviceApi that made them owns what they name.
struct Stream {
  int device = 0;
  uint64_t id = 0;
  static constexpr Stream legacy(int device) { return {device, 0}; }
  bool operator==(const Stream&) const = default;
};

struct Event {
  int device = 0;
  uint64_t id = 0;
};

// cudaStreamCreateWithFlags: a blocking stream is ordered with the legacy default stream both ways (work there
// waits for what was queued here before, and the other way round); a non-blocking one only by events.
enum class StreamFlags : uint8_t { kBlocking, kNonBlocking };

// A byte range that a queued operation reads or writes. Launches declare every range their kernels touch, so
// the simulated device can check that each access is ordered after the last conflicting one.
struct Access {
  const void* ptr = nullptr;
  size_t bytes = 0;
  bool write = false;
};
inline Access reads(const Tensor& t) { return {t.data(), t.nbytes(), false}; }
inline Access writes(const Tensor& t) { return {t.data(), t.nbytes(), true}; }  // also for read-modify-write

// What a launch body gets where the device runs it.
class LaunchContext {
 public:
  virtual ~LaunchContext() = default;
  // The native stream (a cudaStream_t on CUDA; null on the simulated device).
  virtual void* native_stream() const = 0;
  // Device memory as the body may touch it from the host: on CUDA the pointer itself (the body only passes
  // it to its kernels); on the simulated device its host alias, refused unless inside a declared Access.
  virtual absl::StatusOr<void*> host_pointer(const void* device_ptr, size_t bytes) const = 0;
  // `t` re-pointed through host_pointer, on the CPU: what a CPU kernel standing in for a device kernel reads.
  absl::StatusOr<Tensor> host_tensor(const Tensor& t) const;
};

struct KernelLaunch {
  std::string name;  // for messages: "gelu_forward"
  std::vector<Access> accesses;
  // CUDA calls it at once, to enqueue its kernels on ctx.native_stream(); the simulated device calls it on
  // the stream's worker when the stream reaches it.
  std::function<absl::Status(const LaunchContext& ctx)> body;
};

// Calls on one DeviceApi may come from any thread. Errors are sticky as CUDA's are: once device work failed,
// every later call returns that error.
class DeviceApi {
 public:
  virtual ~DeviceApi() = default;
  virtual DeviceType type() const = 0;
  virtual int device_count() const = 0;

  // The calling thread's current device (cudaSetDevice): a launch's stream must be on it, as CUDA requires.
  virtual absl::Status set_current_device(int device) = 0;
  virtual int current_device() const = 0;

  virtual absl::StatusOr<Stream> create_stream(int device, StreamFlags flags) = 0;
  // Work already queued still runs; the handle is dead at once.
  virtual absl::Status destroy_stream(Stream stream) = 0;
  virtual absl::StatusOr<Event> create_event(int device) = 0;
  virtual absl::Status destroy_event(Event event) = 0;

  // The event marks everything queued on `stream` so far (cudaEventRecord).
  virtual absl::Status record(Event event, Stream stream) = 0;
  // Later work on `stream` starts after the event's latest record as of this call (cudaStreamWaitEvent).
  virtual absl::Status wait(Stream stream, Event event) = 0;
  // True once the latest record's work finished; true for an event never recorded.
  virtual absl::StatusOr<bool> query(Event event) = 0;
  virtual absl::Status synchronize(Event event) = 0;
  virtual absl::Status synchronize(Stream stream) = 0;
  // Every stream of the device (cudaDeviceSynchronize).
  virtual absl::Status synchronize_device(int device) = 0;

  // Stream-ordered memory (cudaMallocAsync/cudaFreeAsync): usable on `stream` at once, elsewhere only after
  // an event recorded there; the free takes effect when `stream` reaches it, so every access must be
  // ordered before that point.
  virtual absl::StatusOr<void*> allocate(size_t bytes, Stream stream) = 0;
  virtual absl::Status free(void* ptr, Stream stream) = 0;
  // Page-locked host memory, which asynchronous copies require on their host side.
  virtual absl::StatusOr<void*> allocate_pinned(size_t bytes) = 0;
  virtual absl::Status free_pinned(void* ptr) = 0;

  // Copies in any direction, ordered on `stream`; host memory must be pinned.
  virtual absl::Status copy_async(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  // cudaMemcpy: queued on the legacy default stream of the device involved. It waits for the legacy stream (and
  // so for blocking streams), never for non-blocking ones. It returns when done if the destination is host memory
  // or the source pinned; from pageable or device memory to the device it may return before the bytes landed,
  // so other streams reading them still wait for the legacy stream.
  virtual absl::Status copy(void* dst, const void* src, size_t bytes) = 0;

  virtual absl::Status launch(Stream stream, KernelLaunch launch) = 0;
};

// Waits for `event` by polling query(), so the thread stays free to give up: DeadlineExceeded at `deadline`, or the
// first error `check` returns between polls (where a communicator asks whether a peer failed). Spins briefly for
// short work, then backs off to 1 ms between polls.
absl::Status synchronize_until(DeviceApi& api, Event event, absl::Time deadline,
                               const std::function<absl::Status()>& check = nullptr);

// Later work on `later` starts after everything queued so far on `earlier`, by any thread, without blocking the host;
// `marker` (an event of `earlier`'s device) is recorded there for it.
absl::Status order_after(DeviceApi& api, Stream later, Stream earlier, Event marker);

// api.copy (cudaMemcpy, a synchronous copy on the legacy stream) in the order of `stream`: after the work queued
// there so far, and before its later work. For a host readback of what kernels on a non-blocking stream wrote, and
// an upload they will read.
absl::Status copy_in_order_of(DeviceApi& api, Stream stream, void* dst, const void* src, size_t bytes);

// The stream the calling thread's kernels go to on `device` (a GPU or the simulated device), as PyTorch's current
// stream: the legacy default stream unless a StreamScope on this thread chose another.
Stream current_stream(Device device);

// Makes `stream` the current stream of `device` (a GPU or the simulated device) for the calling thread while it
// lives, then restores the one before; with no stream (a CPU engine's), does nothing. Scopes nest, innermost ending
// first, on the thread that made them. Memory, copies and kernels of the thread then go to `stream`; whatever
// reaches the same memory from another stream must be ordered with it by events (JoinedStreamScope, Work::wait).
class StreamScope {
 public:
  StreamScope(Device device, std::optional<Stream> stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  Device device_;
  bool active_ = false;
  std::optional<Stream> previous_;  // the enclosing scope's stream; none where no scope was open on the device
};

// A StreamScope whose stream is ordered with the caller's current stream: work on `stream` starts after what the
// thread had queued on the caller's stream before, and the caller's stream, once the scope ends, waits for what went
// to `stream` within it. So a library's own stream (the engine's compute stream) reads what the caller uploaded, and
// the caller reads or frees its buffers only after. `marker` (an event of the device) is recorded for each order.
// With no stream, or the caller's own, it orders nothing.
class JoinedStreamScope {
 public:
  JoinedStreamScope(DeviceApi* api, Device device, std::optional<Stream> stream, Event marker);
  ~JoinedStreamScope();
  JoinedStreamScope(const JoinedStreamScope&) = delete;
  JoinedStreamScope& operator=(const JoinedStreamScope&) = delete;
  // Whether the first order was queued: the caller returns an error before queueing anything on the stream.
  absl::Status status() const { return status_; }

 private:
  bool joined() const;
  DeviceApi* api_;
  Stream caller_;
  std::optional<Stream> stream_;
  Event marker_;
  absl::Status status_;
  StreamScope scope_;  // last: made after caller_ was read
};

// A stream or event of `api` that is destroyed with this owner. A destroy's error is dropped: after a device failure
// the handle is left to the lost device. Move-only.
template <typename Handle>
class Owned {
 public:
  static absl::StatusOr<Owned> create(
      DeviceApi& api, int device,
      StreamFlags flags = StreamFlags::kNonBlocking) requires std::is_same_v<Handle, Stream> {
    absl::StatusOr<Stream> stream = api.create_stream(device, flags);
    if (!stream.ok()) return stream.status();
    return Owned(api, *stream);
  }
  static absl::StatusOr<Owned> create(DeviceApi& api, int device) requires std::is_same_v<Handle, Event> {
    absl::StatusOr<Event> event = api.create_event(device);
    if (!event.ok()) return event.status();
    return Owned(api, *event);
  }
  Owned(Owned&& other) noexcept : api_(std::exchange(other.api_, nullptr)), handle_(other.handle_) {}
  Owned& operator=(Owned&& other) noexcept {
    std::swap(api_, other.api_);
    std::swap(handle_, other.handle_);
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (api_ == nullptr) return;
    if constexpr (std::is_same_v<Handle, Stream>) {
      (void)api_->destroy_stream(handle_);
    } else {
      (void)api_->destroy_event(handle_);
    }
  }

  Handle get() const { return handle_; }
  bool owns() const { return api_ != nullptr; }  // false once moved from

 private:
  Owned(DeviceApi& api, Handle handle) : api_(&api), handle_(handle) {}
  DeviceApi* api_;
  Handle handle_;
};
using OwnedStream = Owned<Stream>;
using OwnedEvent = Owned<Event>;

// Page-locked host memory of `api` (allocate_pinned), freed with this owner (an error freeing it is dropped, as
// Owned's). Move-only; empty when default-made or allocated with 0 bytes.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static absl::StatusOr<PinnedBuffer> allocate(DeviceApi& api, size_t bytes);
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    std::swap(api_, other.api_);
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (data_ != nullptr) (void)api_->free_pinned(data_);
  }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  DeviceApi* api_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace zero
