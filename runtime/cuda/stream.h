// RAII CUDA streams and events with Status errors and deadline-bounded waits; the GPU side of overlap.
#pragma once

#include "runtime/device.h"  // cuda_device_count

#include <cuda_runtime_api.h>

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace zero {

class CudaStream;

// A completion marker on a stream (timing disabled). Move-only; destroyed with the device guard set.
class CudaEvent {
 public:
  static absl::StatusOr<CudaEvent> create(int device);
  CudaEvent(CudaEvent&& other) noexcept { *this = std::move(other); }
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();

  cudaEvent_t get() const { return event_; }
  int device() const { return device_; }
  // Marks the point after everything enqueued on `stream` so far.
  absl::Status record(const CudaStream& stream);
  // Marks the point after everything enqueued so far on the device's legacy default stream, where the
  // kernels run (they name no stream), by any thread.
  absl::Status record_on_default_stream();
  // True once the work before the last record() finished; true also when never recorded.
  absl::StatusOr<bool> query() const;
  // Waits for the recorded work by polling (the thread stays interruptible). Returns DeadlineExceeded at
  // `deadline`, or the first error `check` returns (called between polls: the place to ask a
  // communication library whether a peer failed).
  absl::Status synchronize(absl::Time deadline, const std::function<absl::Status()>& check = nullptr) const;

 private:
  CudaEvent(int device, cudaEvent_t event) : device_(device), event_(event) {}
  int device_ = -1;
  cudaEvent_t event_ = nullptr;
};

// A stream of its own on one device, independent of the legacy default stream where the kernels run
// (they name no stream): work here overlaps theirs, and is ordered after it only by an event
// (wait_for_default_stream). Move-only.
class CudaStream {
 public:
  static absl::StatusOr<CudaStream> create(int device);
  CudaStream(CudaStream&& other) noexcept { *this = std::move(other); }
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  // Later work on this stream starts after `event`'s recorded work, without blocking the host.
  absl::Status wait(const CudaEvent& event);
  // Later work on this stream starts after everything enqueued so far on the device's legacy default
  // stream (by any thread), without blocking the host; `marker` is recorded there for it.
  absl::Status wait_for_default_stream(CudaEvent& marker);
  // Waits for everything enqueued so far, giving up with DeadlineExceeded at `deadline`.
  absl::Status synchronize(absl::Time deadline);

 private:
  CudaStream(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
};

}  // namespace zero
