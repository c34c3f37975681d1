// Kernels, memsets and copies queued through cuda_api() on a device's legacy default stream, where the kernels run.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_check.h"

namespace zero {

// cuda_api().launch of `enqueue(stream)` (an absl::Status) on cuda:`device`'s legacy default stream, which must be
// the calling thread's current device (a CudaDeviceGuard set before). CUDA calls the body at once, so `enqueue` may
// capture by reference, and checks cudaGetLastError after it. No accesses are declared: CUDA checks none.
template <typename Enqueue>
absl::Status launch_on_legacy_stream(int device, std::string name, const Enqueue& enqueue) {
  const auto body = [&](const LaunchContext& ctx) { return enqueue(static_cast<cudaStream_t>(ctx.native_stream())); };
  return cuda_api().launch(Stream::legacy(device), KernelLaunch{.name = std::move(name), .accesses = {}, .body = body});
}

// kernel<<<grid, block>>>(args...) on cuda:`device`'s legacy default stream, as above.
template <typename... Params, typename... Args>
absl::Status launch_kernel(int device, std::string name, void (*kernel)(Params...), dim3 grid, dim3 block,
                           const Args&... args) {
  return launch_on_legacy_stream(device, std::move(name), [&](cudaStream_t stream) {
    kernel<<<grid, block, 0, stream>>>(args...);
    return absl::OkStatus();
  });
}

// Zeroes `bytes` of device memory in the order of cuda:`device`'s legacy default stream, as above.
inline absl::Status zero_on_legacy_stream(int device, void* ptr, size_t bytes) {
  return launch_on_legacy_stream(device, "memset", [&](cudaStream_t stream) {
    return cuda_status(cudaMemsetAsync(ptr, 0, bytes, stream), "cudaMemsetAsync");
  });
}

}  // namespace zero
