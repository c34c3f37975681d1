#include "kernels/widened.h"

#include <memory>

#include "kernels/check.h"
#include "kernels/kernels.h"
#include "runtime/status.h"

namespace zero::kernels::detail {

absl::Status on_widened(const std::vector<std::pair<Tensor, Role>>& args,
                        const std::function<absl::Status(const std::vector<Tensor>&)>& fp32_call) {
  std::vector<Tensor> fp32;
  std::vector<std::unique_ptr<float[]>> copies(args.size());  // uninitialized: the outputs are written whole
  for (size_t k = 0; k < args.size(); ++k) {
    const auto& [t, role] = args[k];
    if (!given(t) || t.dtype() == DType::kF32) {
      fp32.push_back(t);
      continue;
    }
    copies[k].reset(new float[static_cast<size_t>(t.numel())]);
    fp32.emplace_back(copies[k].get(), DType::kF32, t.shape());
    if (role != Role::kOut) ZERO_RETURN_IF_ERROR(cast(fp32.back(), t));
  }
  ZERO_RETURN_IF_ERROR(fp32_call(fp32));
  for (size_t k = 0; k < args.size(); ++k) {
    if (copies[k] != nullptr && args[k].second != Role::kIn) ZERO_RETURN_IF_ERROR(cast(args[k].first, fp32[k]));
  }
  return absl::OkStatus();
}

}  // namespace zero::kernels::detail
