// GELU (tanh approximation) and the residual add on CUDA, forward and backward: one grid-stride loop each.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  ZERO_GRID_STRIDE(i, n) {
    const float v = inp[i];
    out[i] = 0.5f * v * (1.0f + tanhf(kGeluScale * (v + kGeluCubic * v * v * v)));
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  ZERO_GRID_STRIDE(i, n) {
    const float v = inp[i];
    const float th = tanhf(kGeluScale * (v + kGeluCubic * v * v * v));
    const float sech2 = 1.0f - th * th;  // d tanh(u) / du
    const float local = 0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dinp[i] = local * dout[i];
  }
}

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, int64_t n) {
  ZERO_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void residual_backward_kernel(float* dinp, const float* dout, int64_t n) {
  ZERO_GRID_STRIDE(i, n) dinp[i] += dout[i];
}

}  // namespace

absl::Status gelu_forward(int device, float* out, const float* inp, int64_t n) {
  return launch_elementwise(device, "gelu_forward_kernel", gelu_forward_kernel, n, out, inp);
}

absl::Status gelu_backward(int device, float* dinp, const float* inp, const float* dout, int64_t n) {
  return launch_elementwise(device, "gelu_backward_kernel", gelu_backward_kernel, n, dinp, inp, dout);
}

absl::Status residual_forward(int device, float* out, const float* a, const float* b, int64_t n) {
  return launch_elementwise(device, "residual_forward_kernel", residual_forward_kernel, n, out, a, b);
}

absl::Status residual_backward(int device, float* dinp, const float* dout, int64_t n) {
  return launch_elementwise(device, "residual_backward_kernel", residual_backward_kernel, n, dinp, dout);
}

}  // namespace zero::kernels::cuda
