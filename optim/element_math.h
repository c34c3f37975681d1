// Per-element update formulas shared by the CPU loops and the CUDA kernels, so both compute the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ZERO_HD __host__ __device__ __forceinline__
#else
#define ZERO_HD inline
#endif

namespace zero::optim {

// Correctly rounded on both sides (nvcc's default -prec-sqrt=true; the host is IEEE).
ZERO_HD float sqrt_f(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

// Scalars of one step for one parameter group, rounded to fp32 the way PyTorch rounds its Python floats.
struct SgdCoeffs {
  float neg_lr = 0;
  float momentum = 0;
  float one_minus_dampening = 1;
  float weight_decay = 0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer starts as a copy of the first direction (as torch.optim.SGD)
};

// torch.optim.SGD, single-tensor path. Returns the new parameter; `buf` is the momentum buffer.
ZERO_HD float sgd_element(float p, float g, float& buf, const SgdCoeffs& c) {
  float d = c.weight_decay != 0.0f ? g + c.weight_decay * p : g;
  if (c.momentum != 0.0f) {
    buf = c.first_step ? d : buf * c.momentum + c.one_minus_dampening * d;
    d = c.nesterov ? d + c.momentum * buf : buf;
  }
  return p + c.neg_lr * d;
}

struct AdamCoeffs {
  float l2 = 0;         // Adam: weight decay added to the gradient (coupled)
  float decay = 1;      // AdamW: 1 - lr * weight_decay, applied to the parameter first (decoupled)
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float neg_step_size = 0;  // -lr / (1 - beta1^t)
  float bias_correction1 = 1;  // 1 - beta1^t (LAMB)
  float bias_correction2 = 1;  // 1 - beta2^t (LAMB)
  float bias_correction2_sqrt = 1;
  float eps = 1e-8f;
};

// The moment updates of torch.optim.Adam: exp_avg.lerp_(g, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2).
ZERO_HD void adam_moments(float g, float& m, float& v, const AdamCoeffs& c) {
  m = m + c.one_minus_beta1 * (g - m);  // torch's lerp for weights < 0.5
  v = v * c.beta2 + c.one_minus_beta2 * g * g;
}

// torch.optim.Adam / AdamW, single-tensor path. Returns the new parameter.
ZERO_HD float adam_element(float p, float g, float& m, float& v, const AdamCoeffs& c) {
  p = p * c.decay;
  if (c.l2 != 0.0f) g = g + c.l2 * p;
  adam_moments(g, m, v, c);
  const float denom = sqrt_f(v) / c.bias_correction2_sqrt + c.eps;
  return p + c.neg_step_size * m / denom;
}

// LAMB: the Adam moments of the group (without weight decay) and the group's weight decay, which enters u.
struct LambCoeffs {
  AdamCoeffs adam;
  float weight_decay = 0;
};

// LAMB's per-element update direction u = m_hat / (sqrt(v_hat) + eps) + weight_decay * p (You et al. 2019, Alg. 2).
ZERO_HD float lamb_direction(float p, float m, float v, float weight_decay, const AdamCoeffs& c) {
  const float m_hat = m / c.bias_correction1;
  const float v_hat = v / c.bias_correction2;
  return m_hat / (sqrt_f(v_hat) + c.eps) + weight_decay * p;
}

// LARS: the per-group scalars; the per-parameter scaled_lr is passed apart.
struct LarsCoeffs {
  float momentum = 0;
  float weight_decay = 0;
};

// LARS (You et al. 2017, Alg. 1): v = momentum * v + scaled_lr * (g + weight_decay * p); p = p - v,
// where scaled_lr = lr * local_lr of the parameter. Returns the new parameter.
ZERO_HD float lars_element(float p, float g, float& v, float momentum, float scaled_lr, float weight_decay) {
  v = momentum * v + scaled_lr * (g + weight_decay * p);
  return p - v;
}

// Counter-based random bits for stochastic rounding: a function of (seed, step, flat index) only, so
// any sharding and thread count draws the same number for the same element (splitmix64 finaliser).
ZERO_HD uint32_t rounding_bits(uint64_t seed, int64_t step, int64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step + 1) +
               0xD1B54A32D192ED03ull * static_cast<uint64_t>(index);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
}

ZERO_HD uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

ZERO_HD float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// bf16 with stochastic rounding: rounds away from zero with probability equal to the distance from the
// truncated value in bf16 ulps (random low 16 bits added, then truncated). NaN and infinity stay so.
ZERO_HD uint16_t bf16_stochastic(float x, uint32_t r) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) >= 0x7f800000u) return static_cast<uint16_t>((u >> 16) | ((u & 0x7fffffu) ? 0x40u : 0u));
  return static_cast<uint16_t>((u + (r & 0xffffu)) >> 16);
}

// fp16 with stochastic rounding, the same rule as bf16: normal halves keep 10 of fp32's 23 mantissa bits,
// subnormal halves are multiples of 2^-24. Values that round past 65504 become infinity.
ZERO_HD uint16_t fp16_stochastic(float x, uint32_t r) {
  const uint32_t u = bits_of(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x38800000u) {  // |x| >= 2^-14: normal half unless it overflows
    a = (a + (r & 0x1fffu)) & ~0x1fffu;
    if (a >= 0x47800000u) return sign | 0x7c00u;
    return sign | static_cast<uint16_t>((a - 0x38000000u) >> 13);
  }
  const float scaled = float_of(a) * 16777216.0f;  // |x| * 2^24, exact: scaling by a power of two
  const uint32_t whole = static_cast<uint32_t>(scaled);
  const float frac = scaled - static_cast<float>(whole);
  const float draw = static_cast<float>(r >> 8) * (1.0f / 16777216.0f);  // uniform in [0, 1), 24 bits
  return sign | static_cast<uint16_t>(whole + (draw < frac ? 1u : 0u));
}

}  // namespace zero::optim
