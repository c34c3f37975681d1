// Per-element update formulas shared by the CPU loops and the CUDA kernels, so both compute the same bits.
#pragma once

#include <cmath>

#include "runtime/dtype.h"
#include "runtime/host_device.h"

namespace zero::optim {

// Correctly rounded on both sides (nvcc's default -prec-sqrt=true; the host is IEEE).
ZERO_HD float sqrt_f(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

// A shard's gradients as the update loops read them (optimizer.h's Gradients), one element at a time.
struct GradientRead {
  const void* data;  // (S) of dtype
  DType dtype;       // fp32, bf16 or fp16
  float loss_scale;  // divided by where not 1
  float clip;        // multiplied by where below 1
};

// The gradient the update uses from its stored value g, widened: unscaled, then clipped, each in fp32.
ZERO_HD float scaled_gradient(float g, const GradientRead& r) {
  if (r.loss_scale != 1.0f) g = g / r.loss_scale;
  if (r.clip < 1.0f) g = g * r.clip;
  return g;
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
  float l2 = 0;     // Adam: weight decay added to the gradient (coupled)
  float decay = 1;  // AdamW: 1 - lr * weight_decay, applied to the parameter first (decoupled)
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float neg_step_size = 0;     // -lr / (1 - beta1^t)
  float bias_correction1 = 1;  // 1 - beta1^t (LAMB)
  float bias_correction2 = 1;  // 1 - beta2^t (LAMB)
  float bias_correction2_sqrt = 1;
  float eps = 1e-8f;
};

// The moment updates of torch.optim.Adam: exp_avg.lerp_(g, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 -
// beta2).
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

}  // namespace zero::optim
