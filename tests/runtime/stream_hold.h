// Holds a CUDA stream until the test lets it go, so the GPU tests order work by release, not by a sleep.
#pragma once

#include <cuda_runtime.h>

#include <latch>

namespace zero::testing {

// Enqueues on `stream` a host function that returns only once release() is called (or the hold is
// destroyed): the work enqueued after it waits for the test, however loaded the machine is, and a wait
// on the stream from the test's thread before release() does not end (give it a deadline).
class StreamHold {
 public:
  explicit StreamHold(cudaStream_t stream)
      : stream_(stream), launched_(cudaLaunchHostFunc(stream, &StreamHold::wait, &released_)) {}
  ~StreamHold() {
    release();
    if (launched_ == cudaSuccess) cudaStreamSynchronize(stream_);  // the host function is done with released_
  }
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;

  // cudaSuccess when the hold was enqueued.
  cudaError_t launched() const { return launched_; }
  void release() {
    if (!released_.try_wait()) released_.count_down();
  }

 private:
  static void CUDART_CB wait(void* released) { static_cast<std::latch*>(released)->wait(); }

  const cudaStream_t stream_;
  std::latch released_{1};
  const cudaError_t launched_;  // after released_, which the host function reads
};

}  // namespace zero::testing
