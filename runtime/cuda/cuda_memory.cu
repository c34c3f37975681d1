// CUDA device memory for the Allocator, copies and the current device, through cuda_api(). Memory comes from the
// device's stream-ordered pool in the order of the calling thread's current stream, where its kernels run
// (CudaApi::allocate says why, and how the pool is set up). The Allocator accounts what is live.
#include "runtime/cuda/cuda_api.h"
#include "runtime/device.h"

namespace zero {

absl::StatusOr<void*> cuda_alloc(Device device, size_t nbytes) {
  return cuda_api().allocate(nbytes, current_stream(device));
}

// In the current stream's order: kernels enqueued there before still read the memory. Another stream that used it
// must have been waited for there (a collective's Work::wait does that).
void cuda_free(Device device, void* ptr) { (void)cuda_api().free(ptr, current_stream(device)); }

// cudaMemcpy in the order of the current stream of the GPU involved (the destination's when both are).
absl::Status cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  const Device device = dst_device.is_cuda() ? dst_device : src_device;
  return copy_in_order_of(cuda_api(), current_stream(device), dst, src, nbytes);
}

absl::Status cuda_synchronize(Device device) { return cuda_api().synchronize_device(device.index); }

absl::Status cuda_use_device(Device device) { return cuda_api().set_current_device(device.index); }

DeviceApi* cuda_device_api() { return &cuda_api(); }

}  // namespace zero
