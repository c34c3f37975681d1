// What every DeviceApi shares: a tensor seen through a launch's host pointers.
#include "runtime/device_api.h"

#include "runtime/status.h"

namespace zero {

absl::StatusOr<Tensor> LaunchContext::host_tensor(const Tensor& t) const {
  // No memory behind it (Tensor(), or an empty allocation): nothing to re-point, but it is on the CPU now, so a
  // body passing it to a public kernel takes the CPU path rather than launching again from inside the launch.
  if (t.data() == nullptr) return Tensor(nullptr, t.dtype(), t.shape(), t.strides(), Device::cpu());
  ZERO_ASSIGN_OR_RETURN(void* data, host_pointer(t.data(), t.nbytes()));
  return Tensor(data, t.dtype(), t.shape(), t.strides(), Device::cpu());
}

}  // namespace zero
