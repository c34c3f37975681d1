// The math models run in forward and backward: GEMM, GELU, LayerNorm, residual, embedding, cross-entropy, attention,
// casts, norms; the engine's buffer arithmetic.
#pragma once

// Conventions, as llm.c:
// - Free functions on contiguous Tensor views, all on one device. A shape written (N, C) also accepts any shape whose
//   last dim is C, leading dims flattened into N rows.
// - Float tensors are fp32, except where a section says "in the training precision": there every float tensor of a
//   call is fp32, bf16 or fp16, one dtype for all but the fp32 statistics (LayerNorm's mean and rstd, attention's
//   lse). Each element is widened exactly, the math runs in fp32 as it does for fp32 tensors, and each element
//   written is rounded once to nearest even: a bf16 call gives the bits of the fp32 call on the widened tensors,
//   rounded (see each function for what it writes in place). Matmul has its own mixed precision. CUDA follows the
//   same rule; only its fp32 math differs from the CPU's, as for fp32 tensors. One exception: bf16/fp16 attention on
//   CUDA through cuDNN (kernels/cuda/cudnn_attention.h) rounds inside too, its probabilities and score gradients.
// - Every function checks shapes, dtypes and devices and returns InvalidArgument for a mismatch a caller
//   can make. CPU tensors run here; CUDA tensors run the CUDA versions (kernels/cuda/, dispatched on
//   Tensor::device()), asynchronously on the calling thread's current stream of the device (current_stream in
//   runtime/device_api.h: the legacy default stream unless a StreamScope chose another), or return
//   FailedPrecondition in a build without CUDA. Simulated-device tensors (Device::sim) run the CPU code as a
//   launch on the simulated device's current stream (runtime/sim/sim_api.h): they accept what the CPU accepts
//   and give the CPU's bits.
// - An optional argument is passed as Tensor() (null data).
// - Backward ADDS (+=) into parameter gradients (dweight, dbias, dwte, ...), so micro-batches accumulate
//   and tied users sum, and WRITES (=) input gradients (dinp), unless a function says otherwise.
// - Results do not depend on the number of threads: work is split in fixed blocks and every reduction
//   runs in a fixed order, so the same inputs give the same bits under any set_cpu_threads().
// - Threads: kernels called from a thread use its cpu_threads() (runtime/cpu_threads.h), which every rank
//   thread sets to its share of the host's cores. OpenBLAS (Debian's pthread build) is set to one thread
//   process-wide the first time a GEMM runs: rank threads calling a multi-threaded OpenBLAS would serialize
//   on its thread server and oversubscribe the cores, so matmul splits the GEMM into fixed tiles itself and
//   runs one single-threaded sgemm per tile on the calling thread's OpenMP team.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/tensor.h"

namespace zero::kernels {

// ---- Matmul ---------------------------------------------------------------------------------------

// How CUDA runs an fp32 GEMM: kExact (fp32 products and sums, the default) or kTf32 (tensor cores: each operand
// rounded to TF32's 11 significant bits, the products summed in fp32), as PyTorch's allow_tf32. The CPU, and the
// simulated device that runs its code, always compute kExact.
enum class Fp32Gemm { kExact, kTf32 };

// out (N, OC) = inp (N, C) · weight (OC, C)^T + bias (OC). weight as nn.Linear; bias may be undefined
// (Tensor()) for no bias.
// Mixed precision: inp and weight both bf16 or both fp16 are multiplied exactly and summed in fp32 (CUDA: on tensor
// cores; the CPU, and the simulated device that runs its code: the fp32 GEMM on their widened values); out and bias
// may each be fp32 or that dtype. The bias is added in fp32 and a half out is rounded once, to nearest even. The CPU
// and CUDA differ in how the fp32 sums run (order, and the tensor cores' own accumulation), not in what is summed.
// out must not overlap inp, weight or bias.
absl::Status matmul_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                            Fp32Gemm fp32_gemm = Fp32Gemm::kExact);

// dinp (N, C) = dout (N, OC) · weight (OC, C)           (written; Tensor(): not computed)
// dweight (OC, C) += dout^T · inp (N, C)
// dbias (OC) += sum over N of dout                      (Tensor(): no bias)
// Mixed precision as matmul_forward: with bf16/fp16 inp and weight, dout is in that dtype too, and dinp,
// dweight, dbias may each be fp32 or that dtype; sums and += run in fp32 (dbias: fp64) and a half
// destination is rounded once. No result may overlap another, dout, inp or weight.
absl::Status matmul_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight, Fp32Gemm fp32_gemm = Fp32Gemm::kExact);

// matmul_forward with GELU after it, as cuBLASLt's epilogue fuses them (c_fc in GPT-2's MLP): pre (N, OC) = inp ·
// weight^T + bias, out (N, OC) = GELU(pre) (gelu_forward's). out and pre one dtype: fp32, or the operands' bf16/fp16,
// where each is rounded once from the same fp32 value, so out is GELU of pre before its rounding, not after. out and
// pre must not overlap each other, inp, weight or bias; pre is what matmul_backward_through_gelu reads back.
absl::Status matmul_gelu_forward(const Tensor& out, const Tensor& pre, const Tensor& inp, const Tensor& weight,
                                 const Tensor& bias, Fp32Gemm fp32_gemm = Fp32Gemm::kExact);

// matmul_forward with a residual added to its sum, as cuBLASLt's epilogue adds a C matrix (c_proj in GPT-2's MLP, the
// block's output): out (N, OC) = inp · weight^T + bias + residual (N, OC). In fp32, matmul_forward then
// residual_forward(out, out, residual), to the bit; out and residual in the operands' bf16/fp16, the fp32 call's value
// rounded once, where those two calls round the sum before the add. out must not overlap residual, inp, weight or
// bias.
absl::Status matmul_residual_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                     const Tensor& residual, Fp32Gemm fp32_gemm = Fp32Gemm::kExact);

// matmul_backward of a layer whose inp is GELU(pre), with GELU's backward fused into dinp (c_proj in GPT-2's MLP):
// dpre (N, C) = GELU'(pre) * (dout (N, OC) · weight (OC, C)) (written, gelu_backward's GELU'), the product's fp32 sum
// multiplied before dpre's one rounding; dweight and dbias as matmul_backward. dpre and pre one dtype: fp32, or the
// operands'. No result may overlap another, pre, dout, inp or weight.
absl::Status matmul_backward_through_gelu(const Tensor& dpre, const Tensor& dweight, const Tensor& dbias,
                                          const Tensor& dout, const Tensor& inp, const Tensor& pre,
                                          const Tensor& weight, Fp32Gemm fp32_gemm = Fp32Gemm::kExact);

// ---- Elementwise, in the training precision ---------------------------------------------------------

// out = GELU(inp), tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Any shape;
// out may alias inp.
absl::Status gelu_forward(const Tensor& out, const Tensor& inp);
// dinp = GELU'(inp) * dout (written). dinp may alias dout.
absl::Status gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout);

// out = a + b, any shape (all three the same); out may alias a or b.
absl::Status residual_forward(const Tensor& out, const Tensor& a, const Tensor& b);
// The residual's backward for one branch: dinp += dout (both same shape), add_into's bits. A block y = x + f(x)
// returns dx = f_backward(dy), then residual_backward(dx, dy).
absl::Status residual_backward(const Tensor& dinp, const Tensor& dout);

// ---- LayerNorm, in the training precision ----------------------------------------------------------

inline constexpr float kLayerNormEps = 1e-5f;

// out (N, C) = (inp - mean) * rstd * weight (C) + bias (C) over the last dim, eps kLayerNormEps (biased
// variance, as nn.LayerNorm). Saves mean (N) and rstd (N) = 1/sqrt(var + eps) for backward.
absl::Status layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                               const Tensor& weight, const Tensor& bias);
// A residual add and the LayerNorm after it in one pass (a pre-LN block's x2 = x + attn, ln_2(x2)): inp (N, C) +=
// residual (N, C), so inp then holds the residual stream as residual_forward(inp, inp, residual) leaves it (rounded,
// in bf16/fp16), and out (not aliasing inp), mean and rstd as layernorm_forward(out, mean, rstd, inp, ...) then gives
// them from it, to the bit.
absl::Status residual_layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                        const Tensor& residual, const Tensor& weight, const Tensor& bias);
// dinp (N, C) written (must not alias dout, inp or dresidual); dweight (C) += sum_n dout * xhat; dbias (C) += sum_n
// dout. mean and rstd may have any shape of N elements, e.g. (B, T). With `dresidual` (N, C), the gradient a residual
// path brings to the same input, dinp is the sum of both, added in fp32 and rounded once: in fp32 the bits of
// residual_backward(dinp, dresidual) after, in bf16/fp16 one rounding fewer.
absl::Status layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                const Tensor& inp, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                const Tensor& dresidual = Tensor());

// ---- Embedding, in the training precision ----------------------------------------------------------

// Kernels that index with int32 tokens or targets on a device check them on the host. `host_tokens` / `host_targets`,
// where the caller has them (Batch::host_inputs), are the same values on the host and are read instead; without them
// the values are copied back, which waits for the device.

// out (B, T, C) = wte (V, C)[tokens (B, T)] + wpe (maxT, C)[t]. tokens int32 in [0, V), T <= maxT.
absl::Status embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                               const Tensor& host_tokens = Tensor());
// dwte[tokens[b, t]] += dout[b, t]; dwpe[t] += sum_b dout[b, t]. dwte (V, C), dwpe (maxT, C). Each row of dwte and
// dwpe gets its dout rows added in row order, in fp32, and is rounded once.
absl::Status embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                                const Tensor& host_tokens = Tensor());

// An int32 tensor's elements (tokens, targets) readable on the host: its own data on the CPU; for a CUDA or
// simulated-device tensor `host` when it has data (an int32 CPU tensor of as many elements, which the caller
// vouches holds the same values), or else a copy into `copy`, which waits for the work queued before it on the
// calling thread's current stream of the device.
absl::StatusOr<const int32_t*> int32_on_host(const Tensor& t, const Tensor& host, std::vector<int32_t>& copy);

// ---- Softmax cross-entropy, in the training precision ----------------------------------------------

inline constexpr int32_t kIgnoreIndex = -1;

struct CrossEntropyResult {
  float loss = 0;       // mean of -log softmax(logits)[target] over the counted targets; 0 if none
  int64_t counted = 0;  // targets != kIgnoreIndex
  int64_t correct = 0;  // counted targets equal to the argmax over the real vocab (ties: lowest index)
};

// Softmax cross-entropy and its gradient in one pass. logits (N, Vp) with the real vocab in columns
// [0, vocab), vocab <= Vp (columns >= vocab are padding: ignored, their gradient 0); targets (N) int32 in
// [0, vocab) or kIgnoreIndex (no loss, zero gradient row).
// dlogits (N, Vp) = loss_scale · (softmax(logits) - onehot(target)) / counted (written; may alias logits; undefined:
// the loss alone, with the same bits, for a forward no backward follows). The loss scale is part of the gradient's
// one rounding, so an fp16 gradient is scaled before it is rounded (and a power-of-two scale gives the bits of the
// unscaled gradient times the scale, barring overflow and subnormals).
absl::StatusOr<CrossEntropyResult> crossentropy_forward_backward(const Tensor& dlogits, const Tensor& logits,
                                                                 const Tensor& targets, int64_t vocab,
                                                                 const Tensor& host_targets = Tensor(),
                                                                 float loss_scale = 1.0f);

// A cross-entropy's sums over its counted rows, left where it ran by crossentropy_forward_backward_into.
struct LossSums {
  double loss = 0;      // -log softmax(logits)[target] summed over the counted targets
  int64_t correct = 0;  // counted targets equal to the argmax
};
// The result of `counted` targets with these sums: their mean loss (0 if none) and counts.
CrossEntropyResult loss_of(const LossSums& sums, int64_t counted);

// crossentropy_forward_backward with its sums left on the logits' device: written to `sums` (sizeof(LossSums) bytes
// of that device's memory) in the order of the device's work and not read back, so the host does not wait for
// them. Returns how many targets counted, which the host knows from the targets.
absl::StatusOr<int64_t> crossentropy_forward_backward_into(const Tensor& sums, const Tensor& dlogits,
                                                           const Tensor& logits, const Tensor& targets, int64_t vocab,
                                                           const Tensor& host_targets = Tensor(),
                                                           float loss_scale = 1.0f);

// ---- Causal self-attention, in the training precision (lse fp32) ----------------------------------

// inp (B, T, 3C) holds q, k, v side by side, each (B, T, NH, C/NH) within its C columns (GPT-2's c_attn
// output). out (B, T, C) = softmax(q k^T / sqrt(C/NH) + causal mask) v per head, heads concatenated.
// Saves lse (B, NH, T): the log-sum-exp of each query's scaled scores (4·B·NH·T bytes), so backward
// recomputes the probabilities one row at a time; no T×T matrix is stored. Each row's softmax
// subtracts its maximum.
absl::Status attention_forward(const Tensor& out, const Tensor& lse, const Tensor& inp, int64_t num_heads);
// dinp (B, T, 3C) written, from dout (B, T, C) and forward's inp, out and lse.
absl::Status attention_backward(const Tensor& dinp, const Tensor& dout, const Tensor& inp, const Tensor& out,
                                const Tensor& lse, int64_t num_heads);

// ---- Casts and norms ------------------------------------------------------------------------------

// Stochastic rounding for fp32 -> bf16/fp16: rounds up with probability equal to the distance to the
// lower neighbour in ulps, so the result is unbiased in expectation. The random bits of element i are a
// function of (seed, step, index_offset + i) only: the same under any thread count or sharding, and the
// same bits the optimizers' half-precision copy draws.
struct StochasticRounding {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t index_offset = 0;  // flat index of element 0 (a shard's offset in its unit)
};

// out = inp converted elementwise, same numel: fp32 -> bf16/fp16 (round to nearest even, or stochastic
// if `stochastic` is given), bf16/fp16 -> fp32 (exact), or a copy between equal dtypes.
absl::Status cast(const Tensor& out, const Tensor& inp, const StochasticRounding* stochastic = nullptr);

// ---- Flat buffer arithmetic (the engine's gradients) ------------------------------------------------

// Each takes contiguous fp32, bf16 or fp16 tensors of any shape, computes in fp32 and rounds once to the
// tensor's dtype (nearest even), exactly as runtime/dtype.h's load_as_float / store_from_float per element.
// CUDA gives the CPU's bits except in NaN payloads (arithmetic there returns the device's canonical NaN).
// A copy between equal dtypes is cast().

// dst += src; dst and src the same dtype and numel (shapes may differ).
absl::Status add_into(const Tensor& dst, const Tensor& src);
// x /= divisor (a division, not a multiplication by 1 / divisor, which rounds differently). Dividing by 1 touches
// nothing: x keeps every bit, a signaling NaN's included.
absl::Status divide_by(const Tensor& x, float divisor);
// Every byte of x set to 0; x contiguous, any dtype.
absl::Status fill_zero(const Tensor& x);

}  // namespace zero::kernels
