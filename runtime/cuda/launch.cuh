// Kernels queued through cuda_api() on the calling thread's current stream of a device, as the rest of stream_launch.h.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "runtime/cuda/stream_launch.h"

namespace zero {

// kernel<<<grid, block, shared>>>(args...) on cuda:`device`'s current stream (`device` current), through
// launch_on_stream (stream_launch.h): `shared` bytes of dynamic shared memory, opted into past the default 48 KiB.
template <typename... Params, typename... Args>
absl::Status launch_kernel_with_shared(int device, std::string name, void (*kernel)(Params...), dim3 grid, dim3 block,
                                       size_t shared, const Args&... args) {
  if (shared > 48 * 1024) {
    ZERO_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  }
  return launch_on_stream(current_cuda_stream(device), std::move(name), [&](cudaStream_t stream) {
    kernel<<<grid, block, shared, stream>>>(args...);
    return absl::OkStatus();
  });
}

// kernel<<<grid, block>>>(args...), as above without dynamic shared memory.
template <typename... Params, typename... Args>
absl::Status launch_kernel(int device, std::string name, void (*kernel)(Params...), dim3 grid, dim3 block,
                           const Args&... args) {
  return launch_kernel_with_shared(device, std::move(name), kernel, grid, block, 0, args...);
}

}  // namespace zero
