// Work queued through cuda_api() on the calling thread's current stream of a device (current_stream: the legacy
// default stream unless a StreamScope chose another): library calls, memsets, stream-ordered scratch. Host code only,
// so files the host compiler builds (cuDNN's graphs) use it too; kernels<<<>>> are launched through launch.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/device_api.h"
#include "runtime/status.h"

namespace zero {

// cuda_api().launch of `enqueue(native stream)` (an absl::Status) on `stream`, whose device must be the calling
// thread's current device (a CudaDeviceGuard set before). CUDA calls the body at once, so `enqueue` may capture by
// reference, and checks cudaGetLastError after it. No accesses are declared: CUDA checks none.
template <typename Enqueue>
absl::Status launch_on_stream(Stream stream, std::string name, const Enqueue& enqueue) {
  const auto body = [&](const LaunchContext& ctx) { return enqueue(static_cast<cudaStream_t>(ctx.native_stream())); };
  return cuda_api().launch(stream, KernelLaunch{.name = std::move(name), .accesses = {}, .body = body});
}

// run(native stream) (an absl::Status) as a launch on `stream`: a library's call (cuBLAS, cuBLASLt, cuDNN) whose error
// (a bad argument, no workspace, a refused plan) is returned, not kept by the launch as the device's sticky failure.
template <typename Run>
absl::Status library_call(Stream stream, std::string name, const Run& run) {
  absl::Status result = absl::OkStatus();
  ZERO_RETURN_IF_ERROR(launch_on_stream(stream, std::move(name), [&](cudaStream_t native) {
    result.Update(run(native));
    return absl::OkStatus();
  }));
  return result;
}

// The calling thread's current stream of cuda:`device`.
inline Stream current_cuda_stream(int device) { return current_stream(Device::cuda(device)); }

// use(scratch) (an absl::Status) with `bytes` of stream-ordered memory of cuda:`device` (current) on its current
// stream, freed there after what `use` queued, on every path: a kernel launcher's scratch. The first error wins.
template <typename Use>
absl::Status with_scratch(int device, size_t bytes, Use&& use) {
  const Stream stream = current_cuda_stream(device);
  absl::StatusOr<void*> scratch = cuda_api().allocate(bytes, stream);
  if (!scratch.ok()) return scratch.status();
  absl::Status status = use(*scratch);
  status.Update(cuda_api().free(*scratch, stream));
  return status;
}

// Zeroes `bytes` of device memory in the order of cuda:`device`'s current stream, as above.
inline absl::Status zero_on_current_stream(int device, void* ptr, size_t bytes) {
  return launch_on_stream(current_cuda_stream(device), "memset", [&](cudaStream_t stream) {
    return cuda_status(cudaMemsetAsync(ptr, 0, bytes, stream), "cudaMemsetAsync");
  });
}

}  // namespace zero
