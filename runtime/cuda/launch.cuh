// Kernels queued through cuda_api() on the calling thread's current stream of a device, as the rest of stream_launch.h.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "runtime/cuda/stream_launch.h"

namespace zero {

// Lets `kernel` take, on cuda:`device` (current), all the dynamic shared memory a block may opt into beside its static
// shared memory, past the default 48 KiB less the static. Always the same value, so threads setting it race harmlessly.
template <typename... Params>
absl::Status allow_all_dynamic_shared(int device, void (*kernel)(Params...)) {
  int opt_in = 0;
  ZERO_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&opt_in, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes{};
  ZERO_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, kernel));
  return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          opt_in - static_cast<int>(attributes.sharedSizeBytes)),
                     "cudaFuncSetAttribute");
}

// kernel<<<grid, block, shared>>>(args...) on cuda:`device`'s current stream (`device` current), through
// launch_on_stream (stream_launch.h), with `shared` bytes of dynamic shared memory (allow_all_dynamic_shared).
template <typename... Params, typename... Args>
absl::Status launch_kernel_with_shared(int device, std::string name, void (*kernel)(Params...), dim3 grid, dim3 block,
                                       size_t shared, const Args&... args) {
  if (shared > 0) ZERO_RETURN_IF_ERROR(allow_all_dynamic_shared(device, kernel));
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
