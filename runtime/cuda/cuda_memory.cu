// CUDA device memory for the Allocator and copies. Memory comes from the device's stream-ordered pool
// (cudaMallocAsync) in the order of the legacy default stream, where the kernels run: a free then needs
// no device-wide synchronization, which cudaFree would impose on every stream (communication included)
// at each bucket or gathered unit the engine lets go. The pool keeps what is freed for reuse (release threshold
// UINT64_MAX): a step frees and allocates the same buckets and gathered units again, which the default threshold of
// 0 would hand back to the driver at every synchronization to be mapped again. The Allocator accounts what is live.
#include <cstdint>
#include <mutex>
#include <set>

#include "absl/status/statusor.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/memory_pool.h"
#include "runtime/device.h"
#include "runtime/status.h"

namespace zero {

namespace {

absl::StatusOr<cudaMemPool_t> default_pool(int device) {
  cudaMemPool_t pool = nullptr;
  ZERO_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device));
  return pool;
}

// Once per device: the pool keeps all freed memory, so it grows to about the most that was live at once and stays.
absl::Status configure_pool(int device) {
  static std::mutex mu;
  static std::set<int> configured;
  std::lock_guard lock(mu);
  if (configured.contains(device)) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(cudaMemPool_t pool, default_pool(device));
  uint64_t keep_everything = UINT64_MAX;
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  configured.insert(device);
  return absl::OkStatus();
}

absl::Status grant_pool_access(int owner, int peer) {
  int can_access = 0;
  ZERO_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can_access, peer, owner));
  if (can_access == 0) return absl::OkStatus();  // NCCL then goes through its own buffers
  ZERO_ASSIGN_OR_RETURN(cudaMemPool_t pool, default_pool(owner));
  cudaMemAccessDesc access{};
  access.location.type = cudaMemLocationTypeDevice;
  access.location.id = peer;
  access.flags = cudaMemAccessFlagsProtReadWrite;
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAccess(pool, &access, 1));
  return absl::OkStatus();
}

}  // namespace

absl::Status share_pool_memory(int a, int b) {
  if (a == b) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(grant_pool_access(a, b));
  return grant_pool_access(b, a);
}

absl::StatusOr<void*> cuda_alloc(Device device, size_t nbytes) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device.index));
  ZERO_RETURN_IF_ERROR(configure_pool(device.index));
  void* ptr = nullptr;
  const cudaError_t err = cudaMallocAsync(&ptr, nbytes, cudaStreamLegacy);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("allocating ", nbytes, " bytes on ", device.to_string(), " failed: device memory is full"));
  }
  ZERO_CUDA_RETURN_IF_ERROR(err);
  return ptr;
}

// In stream order: kernels enqueued before still read the memory. Another stream that used it must have
// finished first (the communicators wait for their collectives before a buffer is let go).
void cuda_free(Device device, void* ptr) {
  CudaDeviceGuard guard;
  if (guard.set(device.index).ok()) cudaFreeAsync(ptr, cudaStreamLegacy);
}

absl::Status cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(dst_device.is_cuda() ? dst_device.index : src_device.index));
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
  return absl::OkStatus();
}

absl::Status cuda_synchronize(Device device) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device.index));
  ZERO_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

absl::Status cuda_use_device(Device device) {
  return cuda_status(cudaSetDevice(device.index), absl::StrCat("cudaSetDevice(", device.index, ")").c_str());
}

}  // namespace zero
