// Host allocation, and the CUDA entry points' answer in a build without CUDA.
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "runtime/device_memory.h"

namespace zero {

namespace {
constexpr size_t kCpuAlignment = 64;

absl::StatusOr<void*> cpu_alloc(size_t nbytes) {
  const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  void* p = std::aligned_alloc(kCpuAlignment, rounded);
  if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("host allocation of ", nbytes, " bytes failed"));
  return p;
}
}  // namespace

#ifndef ZERO_HAS_CUDA
absl::StatusOr<void*> cuda_alloc(Device device, size_t) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot allocate on ", device.to_string(), ": zero was built without CUDA (-DZERO_WITH_CUDA=ON)"));
}
void cuda_free(Device, void*) {}
#else
absl::StatusOr<void*> cuda_alloc(Device device, size_t nbytes);  // runtime/cuda/cuda_memory.cu
void cuda_free(Device device, void* ptr);
#endif

absl::StatusOr<void*> device_alloc(Device device, size_t nbytes) {
  return device.is_cpu() ? cpu_alloc(nbytes) : cuda_alloc(device, nbytes);
}

void device_free(Device device, void* ptr) {
  if (device.is_cpu()) {
    std::free(ptr);
  } else {
    cuda_free(device, ptr);
  }
}

}  // namespace zero
