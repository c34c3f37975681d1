#include "kernels/widened.h"

#include "kernels/check.h"
#include "kernels/kernels.h"
#include "runtime/status.h"

namespace zero::kernels::detail {

absl::Status on_widened(std::vector<Tensor> tensors, std::initializer_list<size_t> written,
                        const std::function<absl::Status(const std::vector<Tensor>&)>& fp32_call) {
  const std::vector<Tensor> originals = tensors;
  std::vector<std::vector<float>> copies(tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (!given(tensors[k]) || tensors[k].dtype() == DType::kF32) continue;
    copies[k].resize(static_cast<size_t>(tensors[k].numel()));
    tensors[k] = Tensor(copies[k].data(), DType::kF32, tensors[k].shape());
    ZERO_RETURN_IF_ERROR(cast(tensors[k], originals[k]));
  }
  ZERO_RETURN_IF_ERROR(fp32_call(tensors));
  for (const size_t k : written) {
    if (!copies[k].empty()) ZERO_RETURN_IF_ERROR(cast(originals[k], tensors[k]));
  }
  return absl::OkStatus();
}

}  // namespace zero::kernels::detail
