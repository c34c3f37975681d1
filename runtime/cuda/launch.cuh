// Kernels queued through cuda_api() on the calling thread's current stream of a device, as the rest of stream_launch.h.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "runtime/cuda/stream_launch.h"

namespace zero {

// kernel<<<grid, block>>>(args...) on cuda:`device`'s current stream, through launch_on_stream (stream_launch.h).
template <typename... Params, typename... Args>
absl::Status launch_kernel(int device, std::string name, void (*kernel)(Params...), dim3 grid, dim3 block,
                           const Args&... args) {
  return launch_on_stream(current_cuda_stream(device), std::move(name), [&](cudaStream_t stream) {
    kernel<<<grid, block, 0, stream>>>(args...);
    return absl::OkStatus();
  });
}

}  // namespace zero
