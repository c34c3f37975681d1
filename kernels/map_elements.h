// The CPU's elementwise loop in the training precision: each output element is fn of the inputs' elements, widened.
#pragma once

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/parallel.h"
#include "runtime/tensor.h"

namespace zero::kernels::detail {

// out[i] = rounded(fn(inputs[k][i] widened...)) over every element, for contiguous CPU tensors of dtype T (out may be
// one of the inputs), in fixed blocks of 2^14 elements over the threads.
template <DType T, typename Fn, typename... In>
void map_elements(const Tensor& out, Fn fn, const In&... inputs) {
  constexpr int64_t kBlock = 1 << 14;  // 64 KiB of fp32
  void* y = out.data();
  for_blocks(out.numel(), kBlock, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) store_from_float(y, T, i, fn(load_as_float(inputs.data(), T, i)...));
  });
}

}  // namespace zero::kernels::detail
