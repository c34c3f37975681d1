// GELU (tanh approximation) and the residual add, forward and backward.
#include <cmath>

#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/fast_math.h"
#include "kernels/kernels.h"
#include "runtime/parallel.h"
#include "runtime/sim/sim_api.h"
#include "runtime/status.h"

namespace zero::kernels {
namespace {

constexpr int64_t kBlock = 1 << 14;  // elements per thread block: 64 KiB of fp32

// Every argument has `first`'s shape, is contiguous fp32, and all live on the CPU.
absl::Status check_elementwise(absl::string_view op,
                               std::initializer_list<std::pair<const char*, const Tensor*>> args) {
  const Tensor& first = *args.begin()->second;
  for (const auto& [name, t] : args) ZERO_RETURN_IF_ERROR(detail::check_like(op, name, *t, first));
  return detail::check_backend(op, first.device());
}

template <typename Fn>
void for_each_element(int64_t n, Fn&& fn) {
  for_blocks(n, kBlock, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

}  // namespace

absl::Status gelu_forward(const Tensor& out, const Tensor& inp) {
  ZERO_RETURN_IF_ERROR(check_elementwise("gelu_forward", {{"inp", &inp}, {"out", &out}}));
  if (inp.device().is_sim()) {
    return launch_on_sim(inp.device(), "gelu_forward", {reads(inp), writes(out)},
                         [=](HostTensors& host) { return gelu_forward(host(out), host(inp)); });
  }
#if ZERO_HAS_CUDA
  if (inp.device().is_cuda()) {
    return cuda::gelu_forward(inp.device().index, out.data_as<float>(), inp.data_as<float>(), inp.numel());
  }
#endif
  const float* x = inp.data_as<float>();
  float* y = out.data_as<float>();
  for_each_element(inp.numel(), [&](int64_t i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + detail::tanh_rational(kGeluScale * (v + kGeluCubic * v * v * v)));
  });
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
    return cuda::gelu_backward(inp.device().index, dinp.data_as<float>(), inp.data_as<float>(), dout.data_as<float>(),
                               inp.numel());
  }
#endif
  const float* x = inp.data_as<float>();
  const float* g = dout.data_as<float>();
  float* dx = dinp.data_as<float>();
  for_each_element(inp.numel(), [&](int64_t i) {
    const float v = x[i];
    const float th = detail::tanh_rational(kGeluScale * (v + kGeluCubic * v * v * v));
    const float sech2 = 1.0f - th * th;  // d tanh(u) / du
    const float local = 0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = local * g[i];
  });
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
    return cuda::residual_forward(a.device().index, out.data_as<float>(), a.data_as<float>(), b.data_as<float>(),
                                  a.numel());
  }
#endif
  const float* pa = a.data_as<float>();
  const float* pb = b.data_as<float>();
  float* po = out.data_as<float>();
  for_each_element(a.numel(), [&](int64_t i) { po[i] = pa[i] + pb[i]; });
  return absl::OkStatus();
}

absl::Status residual_backward(const Tensor& dinp, const Tensor& dout) {
  ZERO_RETURN_IF_ERROR(check_elementwise("residual_backward", {{"dout", &dout}, {"dinp", &dinp}}));
  if (dout.device().is_sim()) {
    return launch_on_sim(dout.device(), "residual_backward", {reads(dout), writes(dinp)},
                         [=](HostTensors& host) { return residual_backward(host(dinp), host(dout)); });
  }
#if ZERO_HAS_CUDA
  if (dout.device().is_cuda()) {
    return cuda::residual_backward(dout.device().index, dinp.data_as<float>(), dout.data_as<float>(), dout.numel());
  }
#endif
  const float* g = dout.data_as<float>();
  float* d = dinp.data_as<float>();
  for_each_element(dout.numel(), [&](int64_t i) { d[i] += g[i]; });
  return absl::OkStatus();
}

}  // namespace zero::kernels
