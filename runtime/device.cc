// The check that a CUDA device is there, in every build: one message for each caller that wants a GPU.
#include "runtime/device.h"

namespace zero {

absl::Status check_cuda_device(int index) {
  const int count = cuda_device_count();
  if (index >= 0 && index < count) return absl::OkStatus();
  if (count == 0) return absl::FailedPreconditionError(why_no_cuda_device());
  return absl::FailedPreconditionError(absl::StrCat("cuda:", index, " is not there: ", count,
                                                    " CUDA device(s) visible (CUDA_VISIBLE_DEVICES picks them)"));
}

}  // namespace zero
