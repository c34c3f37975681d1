// A typed, shaped, non-owning view of memory on one device; the engine hands these out of flat buffers.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/inlined_vector.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace zero {

using Shape = absl::InlinedVector<int64_t, 4>;

int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
std::string shape_string(const Shape& shape);

// Whether bytes [a, a + a_bytes) and [b, b + b_bytes) share a byte (an empty range shares none).
bool bytes_overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes);

class Tensor {
 public:
  Tensor() = default;
  // A contiguous (row-major) view.
  Tensor(void* data, DType dtype, Shape shape, Device device = Device::cpu());
  Tensor(void* data, DType dtype, Shape shape, Shape strides, Device device);

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const { return shape_[d]; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const { return strides_ == contiguous_strides(shape_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }

  // Elements [begin, end) of a contiguous tensor, as a 1-D view.
  Tensor slice(int64_t begin, int64_t end) const;
  // `shape` elements starting at flat element `offset` of a contiguous tensor.
  Tensor view(int64_t offset, Shape shape) const;
  // The same memory as a 1-D view.
  Tensor flat() const { return view(0, {numel()}); }

  std::string to_string() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_ = {0};
  Shape strides_ = {1};
  Device device_ = Device::cpu();
};

}  // namespace zero
