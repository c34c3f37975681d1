// Holds a stream of a DeviceApi until the test lets it go, so device tests order work by release, not by a sleep.
#pragma once

#include <latch>

#include "absl/status/status.h"
#include "runtime/device_api.h"
#ifdef ZERO_HAS_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#endif

namespace zero::testing {

// Queues on `stream` an operation that ends only once release() is called (or the hold is destroyed): the work
// queued after it waits for the test, however loaded the machine is, and a wait on the stream from the test's
// thread before release() does not end (give it a deadline). On CUDA the operation is a host function; on the
// simulated device the launch itself, on the stream's worker.
class StreamHold {
 public:
  StreamHold(DeviceApi& api, Stream stream)
      : api_(api), stream_(stream),
        launched_(api.launch(stream, KernelLaunch{.name = "hold",
                                                  .accesses = {},
                                                  .body = [this](const LaunchContext& ctx) { return hold(ctx); }})) {}
  ~StreamHold() {
    release();
    if (launched_.ok()) (void)api_.synchronize(stream_);  // the hold is done with released_
  }
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;

  // OK when the hold was queued.
  const absl::Status& launched() const { return launched_; }
  void release() {
    if (!released_.try_wait()) released_.count_down();
  }

 private:
  absl::Status hold([[maybe_unused]] const LaunchContext& ctx) {
#ifdef ZERO_HAS_CUDA
    if (api_.type() == DeviceType::kCuda) {
      return cuda_status(cudaLaunchHostFunc(static_cast<cudaStream_t>(ctx.native_stream()), &wait, &released_),
                         "cudaLaunchHostFunc");
    }
#endif
    released_.wait();
    return absl::OkStatus();
  }
#ifdef ZERO_HAS_CUDA
  static void CUDART_CB wait(void* released) { static_cast<std::latch*>(released)->wait(); }
#endif

  DeviceApi& api_;
  const Stream stream_;
  std::latch released_{1};
  const absl::Status launched_;  // after released_, which the hold reads
};

}  // namespace zero::testing
