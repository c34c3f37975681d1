// How far a model run in bf16/fp16 may stray: error bounds derived from where it rounds and the format's unit roundoff.
#pragma once

// A model in the training precision (kernels/kernels.h) computes each kernel in fp32 and rounds what it writes once.
// Its result differs from the exact one by the fp32 error (fp32_tolerance, from the fp32 tests) plus what those
// roundings do downstream. The bounds below are a statistical estimate of that, not a worst case: they take every
// rounding to pass through the layers with a gain of about one, which sums that cancel (a LayerNorm's or a bias's
// gradient) can exceed; the tiny GPT-2 stays 5 to 8 times inside them (mixed_precision_test.cc prints the figures).
//  - A rounding moves each element by at most u|x| (unit_roundoff). Round-to-nearest errors of unrelated values are
//    independent, zero mean and about uniform on [-u, u] (rms u/sqrt(3)), so, like the signal's own terms, they add up
//    to ~u/sqrt(3) of a tensor's scale in whatever they reach, rms.
//  - Parameters and forward activations reach a gradient twice, through the forward and through the backward's dy
//    (2u/sqrt(3) each); the backward's gradients once (u/sqrt(3)); the forward's results see forward roundings only.
//  - Distinct roundings are independent, so they add in quadrature: rms (u/sqrt(3)) sqrt(4(W + F) + Bk) in a gradient.
//  - Over a tensor of a few thousand elements a Gaussian's largest is below 4.5 rms (the chance of one beyond is
//    ~7e-6), and the tensor's largest |value| is at least its rms scale, which max_relative_error divides by.
// Gradients are rounded once more when stored: u. So, as a fraction of a tensor's largest element:
//   gradients  u (1 + 4.5 sqrt((4(W + F) + Bk) / 3)) + fp32_tolerance
//   forward    4.5 u sqrt((W + F) / 3) + fp32_tolerance   (the logits and, times 2 max|logit|, the loss)

#include <cmath>

#include "runtime/dtype.h"

namespace zero::testing {

// Unit roundoff: round to nearest moves x by at most half an ulp, and for p significand bits (the implicit one
// included) that is |round(x) - x| <= u|x| with u = 2^-p, the worst case at x just above a power of two. bf16 has
// p = 8 (7 stored): u = 2^-8; fp16 p = 11: u = 2^-11.
inline double unit_roundoff(DType t) { return t == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

// Where a run rounds, counted in tensors.
struct Roundings {
  int weights = 0;   // W: parameter tensors rounded from fp32 (0 where the compared runs share them)
  int forward = 0;   // F: activation tensors the forward writes
  int backward = 0;  // Bk: activation and input gradients the backward writes
};

inline double gradient_bound(DType t, Roundings r, double fp32_tolerance) {
  return unit_roundoff(t) * (1 + 4.5 * std::sqrt((4.0 * (r.weights + r.forward) + r.backward) / 3)) + fp32_tolerance;
}

inline double forward_bound(DType t, Roundings r, double fp32_tolerance) {
  return unit_roundoff(t) * 4.5 * std::sqrt((r.weights + r.forward) / 3.0) + fp32_tolerance;
}

// GPT-2 with `layers` blocks (models/gpt2.cc). Forward: the embedding's output; per block ln_1, qkv, attention out,
// its projection, x + that (the fused LayerNorm's residual add), ln_2, the MLP hidden before and after GELU, its
// projection with x2 added (one rounding: the residual is in c_proj's epilogue); ln_f and the logits. Backward: the
// logits' gradient, d(ln_f out), the head's dx; per block d(fc) (d(fc_gelu) is not rounded: GELU's backward is taken
// on c_proj's fp32 product), d(ln_2 out), d(x2), d(attention out), d(qkv), d(ln_1 out), dx. Parameters: wte, wpe, 12
// per block, ln_f's two (wte's gradient is stored twice, by the head and the embedding: one u more, within the margin).
// Counted too, for CUDA: cuDNN's attention, which rounds inside (its probabilities in forward, its probabilities and
// score gradients in backward, per block), and cuBLASLt's GELU, which may take the hardware's approximate tanh
// (relative error 2^-11: in fp16 a rounding's worth), one per block in forward and one in backward, where c_proj's
// weight gradient reads that GELU output.
inline Roundings gpt2_roundings(int layers, bool weights_rounded) {
  return {
      .weights = weights_rounded ? 2 + 12 * layers + 2 : 0, .forward = 11 * layers + 3, .backward = 10 * layers + 3};
}

// The MLP with `layers` linear layers (models/mlp.cc). Forward: the inputs rounded, pre and act per hidden layer, the
// logits. Backward: the logits' gradient; per hidden layer GELU's backward and the dx the next layer hands it.
inline Roundings mlp_roundings(int layers, bool weights_rounded) {
  return {.weights = weights_rounded ? 2 * layers : 0, .forward = 2 * layers, .backward = 1 + 2 * (layers - 1)};
}

}  // namespace zero::testing
