// What every DeviceApi shares: a tensor seen through a launch's host pointers.
#include "runtime/device_api.h"

#include "runtime/status.h"

namespace zero {

absl::StatusOr<Tensor> LaunchContext::host_tensor(const Tensor& t) const {
  if (!t.defined() || t.data() == nullptr) return t;
  ZERO_ASSIGN_OR_RETURN(void* data, host_pointer(t.data(), t.nbytes()));
  return Tensor(data, t.dtype(), t.shape(), t.strides(), Device::cpu());
}

}  // namespace zero
