// Calls a generic function with a floating dtype as a compile-time constant, so per-dtype loops and kernels specialise.
#pragma once

#include <type_traits>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero {

template <DType T>
using DTypeConstant = std::integral_constant<DType, T>;

// fn(DTypeConstant<t>{}) for t fp32, bf16 or fp16; the caller has checked that t is one of them.
template <typename Fn>
decltype(auto) visit_floating(DType t, Fn&& fn) {
  switch (t) {
    case DType::kBF16: return fn(DTypeConstant<DType::kBF16>{});
    case DType::kF16: return fn(DTypeConstant<DType::kF16>{});
    default:
      ZERO_CHECK(t == DType::kF32, "visit_floating: ", dtype_name(t), " is not a floating dtype");
      return fn(DTypeConstant<DType::kF32>{});
  }
}

}  // namespace zero
