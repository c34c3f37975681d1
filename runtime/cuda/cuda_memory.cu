// CUDA device memory for the Allocator (cudaMalloc with no caching layer, so accounting is exact) and copies.
#include "absl/status/statusor.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/status.h"
#include "runtime/device.h"

namespace zero {

absl::StatusOr<void*> cuda_alloc(Device device, size_t nbytes) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device.index));
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, nbytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc of ", nbytes, " bytes on ", device.to_string(), " failed: device memory is full"));
  }
  ZERO_CUDA_RETURN_IF_ERROR(err);
  return ptr;
}

// cudaFree waits for the device to finish using the memory, on every stream.
void cuda_free(Device device, void* ptr) {
  CudaDeviceGuard guard;
  if (guard.set(device.index).ok()) cudaFree(ptr);
}

// Between two devices or a device and the host; the device is set to whichever side is CUDA.
absl::Status cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(dst_device.is_cuda() ? dst_device.index : src_device.index));
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
  return absl::OkStatus();
}

absl::Status cuda_use_device(Device device) {
  return cuda_status(cudaSetDevice(device.index), absl::StrCat("cudaSetDevice(", device.index, ")").c_str());
}

}  // namespace zero
