#include "kernels/check.h"

#include "absl/strings/str_cat.h"

namespace zero::kernels::detail {

int64_t last_dim(const Tensor& t) { return t.dim() == 0 ? 1 : t.size(t.dim() - 1); }

absl::Status check_matrix(absl::string_view op, absl::string_view name, const Tensor& t, DType dtype,
                          Device device, int64_t rows, int64_t cols) {
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
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " must hold ", n, " elements, got ", t.to_string()));
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
  return check_matrix(op, name, t, DType::kF32, like.device(), num_rows(like), last_dim(like));
}

absl::Status check_cpu(absl::string_view op, Device device) {
  if (device.is_cpu()) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat(op, ": no CUDA kernel yet (tensors on ", device.to_string(), "); only CPU tensors run"));
}

}  // namespace zero::kernels::detail
