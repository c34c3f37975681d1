// The engine's flat buffer arithmetic (+=, /, zero fill) on fp32/bf16/fp16, in fp32 with one rounding per element.
#include <cstring>

#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "kernels/map_elements.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/sim/sim_api.h"
#include "runtime/status.h"

namespace zero::kernels {

absl::Status add_into(const Tensor& dst, const Tensor& src) {
  constexpr absl::string_view op = "add_into";
  ZERO_RETURN_IF_ERROR(detail::check_floating(op, "dst", dst));
  ZERO_RETURN_IF_ERROR(detail::check_numel(op, "src", src, dst.dtype(), dst.device(), dst.numel()));
  if (dst.device().is_sim()) {
    return launch_on_sim(dst.device(), "add_into", {reads(src), writes(dst)},
                         [=](HostTensors& host) { return add_into(host(dst), host(src)); });
  }
#if ZERO_HAS_CUDA
  if (dst.device().is_cuda())
    return cuda::add_into(dst.device().index, dst.data(), src.data(), dst.dtype(), dst.dtype(), dst.numel());
#endif
  visit_floating(dst.dtype(), [&](auto t) {
    detail::map_elements<decltype(t)::value>(
        dst, [](float x, float y) { return x + y; }, dst, src);
  });
  return absl::OkStatus();
}

absl::Status divide_by(const Tensor& x, float divisor) {
  ZERO_RETURN_IF_ERROR(detail::check_floating("divide_by", "x", x));
  if (divisor == 1.0f) return absl::OkStatus();  // x / 1 is x: no pass over it (one rank, no accumulation)
  if (x.device().is_sim()) {
    return launch_on_sim(x.device(), "divide_by", {writes(x)},
                         [=](HostTensors& host) { return divide_by(host(x), divisor); });
  }
#if ZERO_HAS_CUDA
  if (x.device().is_cuda()) return cuda::divide_by(x.device().index, x.data(), x.dtype(), x.numel(), divisor);
#endif
  visit_floating(x.dtype(), [&](auto t) {
    detail::map_elements<decltype(t)::value>(
        x, [divisor](float v) { return v / divisor; }, x);
  });
  return absl::OkStatus();
}

absl::Status fill_zero(const Tensor& x) {
  constexpr absl::string_view op = "fill_zero";
  ZERO_RETURN_IF_ERROR(detail::check_numel(op, "x", x, x.dtype(), x.device(), x.numel()));
  ZERO_RETURN_IF_ERROR(detail::check_backend(op, x.device()));
  if (x.device().is_sim()) {
    return launch_on_sim(x.device(), "fill_zero", {writes(x)}, [=](HostTensors& host) { return fill_zero(host(x)); });
  }
#if ZERO_HAS_CUDA
  if (x.device().is_cuda()) return cuda::fill_zero(x.device().index, x.data(), static_cast<int64_t>(x.nbytes()));
#endif
  if (x.nbytes() > 0) std::memset(x.data(), 0, x.nbytes());  // an empty tensor may have no memory (null)
  return absl::OkStatus();
}

}  // namespace zero::kernels
