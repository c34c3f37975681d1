// Dtype casts between fp32 and bf16/fp16 (nearest-even or stochastic).
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/parallel.h"
#include "runtime/rounding.h"
#include "runtime/sim/sim_api.h"
#include "runtime/status.h"

namespace zero::kernels {
namespace {

constexpr int64_t kBlock = 1 << 14;

bool is_half(DType t) { return t == DType::kBF16 || t == DType::kF16; }

void to_half(const float* x, uint16_t* y, int64_t begin, int64_t end, DType t, const StochasticRounding* sr) {
  const bool bf16 = t == DType::kBF16;
  if (sr == nullptr && bf16) {
    for (int64_t i = begin; i < end; ++i) y[i] = float_to_bf16(x[i]);
    return;
  }
  if (sr == nullptr) {
    for (int64_t i = begin; i < end; ++i) y[i] = float_to_fp16(x[i]);
    return;
  }
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t r = rounding_bits(sr->seed, sr->step, sr->index_offset + i);
    y[i] = bf16 ? bf16_stochastic(x[i], r) : fp16_stochastic(x[i], r);
  }
}

}  // namespace

absl::Status cast(const Tensor& out, const Tensor& inp, const StochasticRounding* stochastic) {
  constexpr absl::string_view op = "cast";
  const int64_t n = inp.numel();
  ZERO_RETURN_IF_ERROR(
      detail::check_matrix(op, "inp", inp, inp.dtype(), inp.device(), detail::num_rows(inp), detail::last_dim(inp)));
  ZERO_RETURN_IF_ERROR(
      detail::check_matrix(op, "out", out, out.dtype(), inp.device(), detail::num_rows(out), detail::last_dim(out)));
  if (out.numel() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": out ", out.to_string(), " and inp ", inp.to_string(), " differ in numel"));
  }
  ZERO_RETURN_IF_ERROR(detail::check_backend(op, inp.device()));
  const DType from = inp.dtype(), to = out.dtype();
  const bool narrowing = from == DType::kF32 && is_half(to);
  if (stochastic != nullptr && !narrowing) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": stochastic rounding needs fp32 -> bf16/fp16, got ", from, " -> ", to));
  }
  if (inp.device().is_sim()) {  // the rounding's seed, step and offset by value: the launch may run after we return
    std::optional<StochasticRounding> rounding;
    if (stochastic != nullptr) rounding = *stochastic;
    return launch_on_sim(inp.device(), "cast", {reads(inp), writes(out)}, [=](HostTensors& host) {
      return cast(host(out), host(inp), rounding.has_value() ? &*rounding : nullptr);
    });
  }
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) return cuda::cast(inp.device().index, out.data(), to, inp.data(), from, n, stochastic);
#endif
  if (from == to) {
    if (n > 0) std::memcpy(out.data(), inp.data(), inp.nbytes());  // an empty tensor's data may be null
  } else if (narrowing) {
    for_blocks(n, kBlock, [&](int64_t b, int64_t e) {
      to_half(inp.data_as<float>(), out.data_as<uint16_t>(), b, e, to, stochastic);
    });
  } else if (is_half(from) && to == DType::kF32) {
    visit_floating(from, [&](auto type) {  // the dtype a constant, so the loop vectorizes
      constexpr DType T = decltype(type)::value;
      const StorageOf<T>* src = inp.data_as<const StorageOf<T>>();
      float* dst = out.data_as<float>();
      for_blocks(n, kBlock, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) dst[i] = load_as_float(src, T, i);
      });
    });
  } else {
    return absl::InvalidArgumentError(absl::StrCat(op, ": no cast from ", from, " to ", to));
  }
  return absl::OkStatus();
}

}  // namespace zero::kernels
