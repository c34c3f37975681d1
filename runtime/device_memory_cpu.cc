// Host allocation and copies, the simulated device's, and the CUDA entry points' answer in a build without CUDA.
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/device_memory.h"
#include "runtime/sim/sim_api.h"

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
int cuda_device_count() { return 0; }
std::string why_no_cuda_device() { return "zero was built without CUDA; configure with -DZERO_WITH_CUDA=ON"; }
absl::Status no_cuda(absl::string_view what, Device device) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot ", what, " ", device.to_string(), ": zero was built without CUDA (-DZERO_WITH_CUDA=ON)"));
}
absl::StatusOr<void*> cuda_alloc(Device device, size_t) { return no_cuda("allocate on", device); }
void cuda_free(Device, void*) {}
absl::Status cuda_copy(void*, Device dst_device, const void*, Device src_device, size_t) {
  return no_cuda("copy to or from", dst_device.is_cuda() ? dst_device : src_device);
}
absl::Status cuda_use_device(Device device) { return no_cuda("use", device); }
absl::Status cuda_synchronize(Device device) { return no_cuda("synchronize", device); }
DeviceApi* cuda_device_api() { return nullptr; }
#else
absl::StatusOr<void*> cuda_alloc(Device device, size_t nbytes);  // runtime/cuda/cuda_memory.cu
void cuda_free(Device device, void* ptr);
absl::Status cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
absl::Status cuda_use_device(Device device);
absl::Status cuda_synchronize(Device device);
DeviceApi* cuda_device_api();
#endif

absl::StatusOr<void*> device_alloc(Device device, size_t nbytes) {
  if (device.is_sim()) return sim_device().allocate(nbytes, current_stream(device));
  return device.is_cpu() ? cpu_alloc(nbytes) : cuda_alloc(device, nbytes);
}

void device_free(Device device, void* ptr) {
  if (device.is_cpu()) {
    std::free(ptr);
  } else if (device.is_sim()) {
    (void)sim_device().free(ptr, current_stream(device));  // sticky there: the next call reports it
  } else {
    cuda_free(device, ptr);
  }
}

absl::Status copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return absl::OkStatus();
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return absl::OkStatus();
  }
  if (dst_device.is_sim() || src_device.is_sim()) {
    const Device device = dst_device.is_sim() ? dst_device : src_device;
    return copy_in_order_of(sim_device(), current_stream(device), dst, src, nbytes);
  }
  return cuda_copy(dst, dst_device, src, src_device, nbytes);
}

absl::Status use_device_on_this_thread(Device device) {
  if (device.is_sim()) return sim_device().set_current_device(device.index);
  return device.is_cpu() ? absl::OkStatus() : cuda_use_device(device);
}

absl::Status synchronize(Device device) {
  if (device.is_sim()) return sim_device().synchronize_device(device.index);
  return device.is_cpu() ? absl::OkStatus() : cuda_synchronize(device);
}

DeviceApi* device_api(Device device) {
  if (device.is_sim()) return &sim_device();
  return device.is_cpu() ? nullptr : cuda_device_api();
}

}  // namespace zero
