// GELU (tanh approximation) and the residual add, forward and backward, in fp32, bf16 or fp16.
#include <cmath>

#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/fast_math.h"
#include "kernels/kernels.h"
#include "kernels/map_elements.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/sim/sim_api.h"
#include "runtime/status.h"

namespace zero::kernels {
namespace {

// Every argument has `first`'s shape and floating dtype, is contiguous, and all live on one device.
absl::Status check_elementwise(absl::string_view op,
                               std::initializer_list<std::pair<const char*, const Tensor*>> args) {
  const auto& [first_name, first] = *args.begin();
  ZERO_RETURN_IF_ERROR(detail::check_floating(op, first_name, *first));
  for (const auto& [name, t] : args) ZERO_RETURN_IF_ERROR(detail::check_like(op, name, *t, *first));
  return detail::check_backend(op, first->device());
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// The element functions are lambdas, so map_elements inlines them (a function pointer it might call).
constexpr auto gelu = [](float v) {
  return 0.5f * v * (1.0f + detail::tanh_rational(kGeluScale * (v + kGeluCubic * v * v * v)));
};

// GELU'(v) * g.
constexpr auto gelu_grad = [](float v, float g) {
  const float th = detail::tanh_rational(kGeluScale * (v + kGeluCubic * v * v * v));
  const float sech2 = 1.0f - th * th;  // d tanh(u) / du
  const float local = 0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
  return local * g;
};

constexpr auto add = [](float a, float b) { return a + b; };

}  // namespace

absl::Status gelu_forward(const Tensor& out, const Tensor& inp) {
  ZERO_RETURN_IF_ERROR(check_elementwise("gelu_forward", {{"inp", &inp}, {"out", &out}}));
  if (inp.device().is_sim()) {
    return launch_on_sim(inp.device(), "gelu_forward", {reads(inp), writes(out)},
                         [=](HostTensors& host) { return gelu_forward(host(out), host(inp)); });
  }
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::gelu_forward(inp.device().index, out.data(), inp.data(), inp.dtype(), inp.numel());
  }
#endif
  visit_floating(inp.dtype(), [&](auto t) { detail::map_elements<decltype(t)::value>(out, gelu, inp); });
  return absl::OkStatus();
}

absl::Status gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  ZERO_RETURN_IF_ERROR(check_elementwise("gelu_backward", {{"inp", &inp}, {"dout", &dout}, {"dinp", &dinp}}));
  if (inp.device().is_sim()) {
    return launch_on_sim(inp.device(), "gelu_backward", {reads(inp), reads(dout), writes(dinp)},
                         [=](HostTensors& host) { return gelu_backward(host(dinp), host(inp), host(dout)); });
  }
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::gelu_backward(inp.device().index, dinp.data(), inp.data(), dout.data(), inp.dtype(), inp.dtype(),
                               inp.numel());
  }
#endif
  visit_floating(inp.dtype(), [&](auto t) { detail::map_elements<decltype(t)::value>(dinp, gelu_grad, inp, dout); });
  return absl::OkStatus();
}

absl::Status residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) {
  ZERO_RETURN_IF_ERROR(check_elementwise("residual_forward", {{"a", &a}, {"b", &b}, {"out", &out}}));
  if (a.device().is_sim()) {
    return launch_on_sim(a.device(), "residual_forward", {reads(a), reads(b), writes(out)},
                         [=](HostTensors& host) { return residual_forward(host(out), host(a), host(b)); });
  }
#if ZERO_HAS_CUDA
  if (a.device().is_cuda()) {
    return cuda::residual_forward(a.device().index, out.data(), a.data(), b.data(), a.dtype(), a.numel());
  }
#endif
  visit_floating(a.dtype(), [&](auto t) { detail::map_elements<decltype(t)::value>(out, add, a, b); });
  return absl::OkStatus();
}

absl::Status residual_backward(const Tensor& dinp, const Tensor& dout) {
  ZERO_RETURN_IF_ERROR(check_elementwise("residual_backward", {{"dout", &dout}, {"dinp", &dinp}}));
  return add_into(dinp, dout);
}

}  // namespace zero::kernels
