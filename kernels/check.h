// Argument checks shared by the kernels: dtype, layout, device and (rows, cols) shape, as absl::Status.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/tensor.h"

namespace zero::kernels::detail {

// An optional argument is absent when it is Tensor() (null data).
inline bool given(const Tensor& t) { return t.data() != nullptr; }

// The last dim (1 for a 0-dim tensor) and the rows the leading dims flatten into.
int64_t last_dim(const Tensor& t);
inline int64_t num_rows(const Tensor& t) { return last_dim(t) == 0 ? 0 : t.numel() / last_dim(t); }

// `t` is a contiguous `dtype` tensor on `device` whose last dim is `cols` and that holds rows × cols
// elements: (rows, cols) or any shape flattening to it. Messages name the op and the argument.
absl::Status check_matrix(absl::string_view op, absl::string_view name, const Tensor& t, DType dtype, Device device,
                          int64_t rows, int64_t cols);
// `t` is a contiguous `dtype` tensor on `device` of `n` elements, any shape (mean (N) may be (B, T)).
absl::Status check_numel(absl::string_view op, absl::string_view name, const Tensor& t, DType dtype, Device device,
                         int64_t n);
// `t` has exactly `dims` dims (for arguments whose dims are read separately, such as (B, T, 3C)).
absl::Status check_dims(absl::string_view op, absl::string_view name, const Tensor& t, int64_t dims);
// `t` is a contiguous fp32, bf16 or fp16 tensor on a device this build can run: a kernel in the training precision.
absl::Status check_floating(absl::string_view op, absl::string_view name, const Tensor& t);
// `t` is contiguous, of `like`'s dtype, on `like`'s device, with `like`'s shape.
absl::Status check_like(absl::string_view op, absl::string_view name, const Tensor& t, const Tensor& like);
// OK on the CPU and the simulated device (which runs the CPU code), and on CUDA when built with it
// (kernels/cuda/); FailedPrecondition for a CUDA tensor in a build without CUDA.
absl::Status check_backend(absl::string_view op, Device device);

}  // namespace zero::kernels::detail
