// Raw memory on a device: allocation (the Allocator does the accounting for what the engine and models hold; the
// kernels' scratch, from a few bytes to the gradient norm's 8 MiB of bins, is taken outside it), copies between
// devices, and the DeviceApi behind a device.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "runtime/device.h"
#include "runtime/device_api.h"

namespace zero {

// CPU: 64-byte aligned host memory. GPU and simulated device: stream-ordered (cudaMallocAsync/cudaFreeAsync) on the
// calling thread's current stream (runtime/cuda/cuda_memory.cu); another stream touches new memory only after an
// event from there, and the free must be ordered after every other stream's use.
absl::StatusOr<void*> device_alloc(Device device, size_t nbytes);
void device_free(Device device, void* ptr);

// Copies `nbytes` between any two devices (memcpy, or a synchronous cudaMemcpy in the current stream's order), so
// the caller may use or free either side as soon as it returns.
absl::Status copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

// Makes `device` the calling thread's current CUDA device (nothing for the CPU). A rank's threads adopt
// its GPU, so that CUDA calls naming no device land there and a guard that restores "the previous
// device" never wakes GPU 0 (each context there costs every process hundreds of MiB).
absl::Status use_device_on_this_thread(Device device);

// Waits until `device` finished all work enqueued on it, on every stream (nothing for the CPU).
absl::Status synchronize(Device device);

// The implementation behind `device`'s memory and kernels: sim_device() or cuda_api(); null for the CPU, and for
// CUDA in a build without it.
DeviceApi* device_api(Device device);

}  // namespace zero
