// CUDA device memory for the Allocator, copies and the current device, through cuda_api(). Memory comes from the
// device's stream-ordered pool in the order of the legacy default stream, where the kernels run (CudaApi::allocate
// says why, and how the pool is set up). The Allocator accounts what is live.
#include "runtime/cuda/cuda_api.h"
#include "runtime/device.h"

namespace zero {

absl::StatusOr<void*> cuda_alloc(Device device, size_t nbytes) {
  return cuda_api().allocate(nbytes, Stream::legacy(device.index));
}

// In stream order: kernels enqueued before still read the memory. Another stream that used it must have
// finished first (the communicators wait for their collectives before a buffer is let go).
void cuda_free(Device device, void* ptr) { (void)cuda_api().free(ptr, Stream::legacy(device.index)); }

// On the legacy default stream of the GPU involved (the destination's when both are), as cudaMemcpy.
absl::Status cuda_copy(void* dst, Device, const void* src, Device, size_t nbytes) {
  return cuda_api().copy(dst, src, nbytes);
}

absl::Status cuda_synchronize(Device device) { return cuda_api().synchronize_device(device.index); }

absl::Status cuda_use_device(Device device) { return cuda_api().set_current_device(device.index); }

DeviceApi* cuda_device_api() { return &cuda_api(); }

}  // namespace zero
