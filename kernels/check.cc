#include "kernels/check.h"

#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

namespace zero::kernels {
namespace detail {

int64_t last_dim(const Tensor& t) { return t.dim() == 0 ? 1 : t.size(t.dim() - 1); }

absl::Status check_matrix(absl::string_view op, absl::string_view name, const Tensor& t, DType dtype, Device device,
                          int64_t rows, int64_t cols) {
  if (t.dtype() != dtype || !t.is_contiguous() || t.device() != device || last_dim(t) != cols ||
      t.numel() != rows * cols) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must be a contiguous ", dtype_name(dtype), " (",
                                                   rows, ", ", cols, ") tensor on ", device.to_string(), ", got ",
                                                   t.to_string(), t.is_contiguous() ? "" : " (not contiguous)"));
  }
  return absl::OkStatus();
}

absl::Status check_numel(absl::string_view op, absl::string_view name, const Tensor& t, DType dtype, Device device,
                         int64_t n) {
  if (t.numel() != n) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must hold ", n, " elements, got ", t.to_string()));
  }
  return check_matrix(op, name, t, dtype, device, num_rows(t), last_dim(t));
}

absl::Status check_dims(absl::string_view op, absl::string_view name, const Tensor& t, int64_t dims) {
  if (t.dim() != dims) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must have ", dims, " dims, got ", t.to_string()));
  }
  return absl::OkStatus();
}

absl::Status check_like(absl::string_view op, absl::string_view name, const Tensor& t, const Tensor& like) {
  if (t.shape() != like.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " must have shape ", shape_string(like.shape()), ", got ", t.to_string()));
  }
  return check_matrix(op, name, t, like.dtype(), like.device(), num_rows(like), last_dim(like));
}

absl::Status check_floating(absl::string_view op, absl::string_view name, const Tensor& t) {
  if (!is_floating(t.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must be fp32, bf16 or fp16, got ", t.to_string()));
  }
  ZERO_RETURN_IF_ERROR(check_numel(op, name, t, t.dtype(), t.device(), t.numel()));
  return check_backend(op, t.device());
}

absl::Status check_backend(absl::string_view op, Device device) {
#if ZERO_HAS_CUDA
  constexpr bool kHasCuda = true;
#else
  constexpr bool kHasCuda = false;
#endif
  if (device.is_cpu() || device.is_sim() || kHasCuda) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(op, ": tensors on ", device.to_string(), " but zero was built without CUDA (ZERO_WITH_CUDA=OFF)"));
}

}  // namespace detail

absl::StatusOr<const int32_t*> int32_on_host(const Tensor& t, const Tensor& host, std::vector<int32_t>& copy) {
  if (t.device().is_cpu()) return t.data_as<int32_t>();
  ZERO_RETURN_IF_ERROR(detail::check_backend("int32_on_host", t.device()));
  if (host.data() != nullptr) {
    if (!host.device().is_cpu() || host.dtype() != DType::kI32 || host.numel() != t.numel() || !host.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat("the host copy ", host.to_string(), " of ", t.to_string(),
                                                     " must be a contiguous int32 CPU tensor of as many elements"));
    }
    return host.data_as<int32_t>();
  }
  copy.resize(static_cast<size_t>(t.numel()));
  ZERO_RETURN_IF_ERROR(copy_bytes(copy.data(), Device::cpu(), t.data(), t.device(), t.nbytes()));
  return copy.data();
}

}  // namespace zero::kernels
