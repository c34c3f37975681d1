// GELU (tanh approximation, GPT-2's) and its slope in fp32 on the device: elementwise.cu's kernels and matmul.cu's
// unfused forward epilogue share them.
#pragma once

namespace zero::kernels::cuda {

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu(float v) {
  return 0.5f * v * (1.0f + tanhf(kGeluScale * (v + kGeluCubic * v * v * v)));
}

// d gelu(v) / dv
__device__ __forceinline__ float gelu_slope(float v) {
  const float th = tanhf(kGeluScale * (v + kGeluCubic * v * v * v));
  const float sech2 = 1.0f - th * th;  // d tanh(u) / du
  return 0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
}

}  // namespace zero::kernels::cuda
