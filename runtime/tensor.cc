#include "runtime/tensor.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace zero {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

std::string shape_string(const Shape& shape) { return absl::StrCat("(", absl::StrJoin(shape, ", "), ")"); }

bool bytes_overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);  // unrelated pointers compare
  return a_bytes > 0 && b_bytes > 0 && pa < pb + static_cast<uintptr_t>(b_bytes) &&
         pb < pa + static_cast<uintptr_t>(a_bytes);
}

Tensor::Tensor(void* data, DType dtype, Shape shape, Device device)
    : Tensor(data, dtype, shape, contiguous_strides(shape), device) {}

Tensor::Tensor(void* data, DType dtype, Shape shape, Shape strides, Device device)
    : data_(data), dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)), device_(device) {
  ZERO_CHECK(shape_.size() == strides_.size(), "shape and strides differ in rank");
  for (int64_t d : shape_) ZERO_CHECK(d >= 0, "negative dimension in ", shape_string(shape_));
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  ZERO_CHECK(0 <= begin && begin <= end && end <= numel(), "slice [", begin, ", ", end, ") of ", numel());
  return view(begin, {end - begin});
}

Tensor Tensor::view(int64_t offset, Shape shape) const {
  ZERO_CHECK(is_contiguous(), "view of a non-contiguous tensor ", to_string());
  ZERO_CHECK(offset >= 0 && offset + shape_numel(shape) <= numel(), "view of ", shape_numel(shape), " elements at ",
             offset, " overruns ", to_string());
  char* base = static_cast<char*>(data_) + offset * static_cast<int64_t>(dtype_size(dtype_));
  return Tensor(base, dtype_, std::move(shape), device_);
}

std::string Tensor::to_string() const {
  return absl::StrCat("Tensor(", dtype_name(dtype_), shape_string(shape_), " on ", device_.to_string(), ")");
}

}  // namespace zero
