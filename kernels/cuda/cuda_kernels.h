// CUDA launchers behind kernels.h's dispatch: raw device pointers, arguments already checked by the caller.
#pragma once

// Every launcher makes `device` current, enqueues its kernels through cuda_api() on that device's current
// stream (the nccl backend orders each collective after the work there with an event) and returns without waiting.
// Shapes and semantics are those of the kernels.h function of the same name.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernels.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace zero::kernels::cuda {

// out (N, OC) = inp (N, C) · weight (OC, C)^T + bias (OC); bias may be null. tf32: the GEMM on tensor cores with
// its operands rounded to TF32 (kernels::Fp32Gemm::kTf32).
absl::Status matmul_forward(int device, float* out, const float* inp, const float* weight, const float* bias, int64_t n,
                            int64_t c, int64_t oc, bool tf32);
// dinp (N, C) = dout · weight (dinp may be null); dweight (OC, C) += dout^T · inp; dbias (OC) += column sums (may be
// null). tf32 as matmul_forward.
absl::Status matmul_backward(int device, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, int64_t n, int64_t c, int64_t oc, bool tf32);
// The same on tensor cores: inp, weight and dout in `half` (bf16 or fp16), products summed in fp32; out, bias,
// dinp, dweight, dbias each fp32 or `half` as its dtype says. Bias and gradient adds happen in fp32 and a
// half destination is rounded once (nearest even). A NaN that cuBLASLt's epilogue writes (a half out's bias,
// residual or GELU) is the hardware's canonical one, not the CPU's payload-keeping rounding.
// gelu_pre, where not null, fuses GELU as kernels.h's matmul_gelu_forward and matmul_backward_through_gelu do: out
// (forward) or dinp (backward) then is in `half`, and gelu_pre, in `half` too, is written (forward) or read. residual
// (N, OC), where not null, is added as matmul_residual_forward adds it, out and residual then in `half`.
absl::Status matmul_forward_half(int device, void* out, DType out_dtype, void* gelu_pre, const void* residual,
                                 const void* inp, const void* weight, const void* bias, DType bias_dtype, DType half,
                                 int64_t n, int64_t c, int64_t oc);
absl::Status matmul_backward_half(int device, void* dinp, DType dinp_dtype, const void* gelu_pre, void* dweight,
                                  DType dweight_dtype, void* dbias, DType dbias_dtype, const void* dout,
                                  const void* inp, const void* weight, DType half, int64_t n, int64_t c, int64_t oc);
// How many half GEMMs this process has run through cuBLASLt's epilogues (cublaslt_gemm.h: a half out's bias, residual
// and GELU; the rest took the unfused path): for tests and profiles to tell which ran.
int64_t cublaslt_gemms_run();

// Every tensor of these in `dtype` (fp32, bf16 or fp16), computed in fp32 and each written element rounded once;
// gelu_backward's dout may be fp32 instead (dout_dtype), and then must not overlap dinp.
absl::Status gelu_forward(int device, void* out, const void* inp, DType dtype, int64_t n);
absl::Status gelu_backward(int device, void* dinp, const void* inp, const void* dout, DType dtype, DType dout_dtype,
                           int64_t n);
absl::Status residual_forward(int device, void* out, const void* a, const void* b, DType dtype, int64_t n);

// inp, out (N, C); weight, bias (C) in `dtype`; mean, rstd (N) fp32. residual (N, C), or null: added into inp first.
absl::Status layernorm_forward(int device, void* out, float* mean, float* rstd, void* inp, const void* residual,
                               const void* weight, const void* bias, DType dtype, int64_t n, int64_t c);
// dresidual (N, C), or null: added to dinp before its one rounding. Every tensor but mean and rstd in `dtype`.
absl::Status layernorm_backward(int device, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                                const void* weight, const float* mean, const float* rstd, const void* dresidual,
                                DType dtype, int64_t n, int64_t c);

// tokens (B, T) on the device, checked on the host to lie in [0, V); every float tensor in `dtype`.
absl::Status embedding_forward(int device, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                               DType dtype, int64_t b, int64_t t, int64_t c);
absl::Status embedding_backward(int device, void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                                DType dtype, int64_t b, int64_t t, int64_t c, int64_t vocab);

// logits, dlogits (N, Vp; null: the loss alone) in `dtype`, targets (N) on the device; `scale` = loss scale / counted
// (0 if none). Writes to `sums`, on the device, the sum of -log p(target) over counted rows (fp64) and how many of them
// have argmax == target.
absl::Status crossentropy_forward_backward(int device, LossSums* sums, void* dlogits, const void* logits, DType dtype,
                                           const int32_t* targets, int64_t n, int64_t vocab, int64_t padded,
                                           float scale);

// The largest head size the attention kernels take: they are built for head sizes padded to 64, 128 or 256.
inline constexpr int64_t kMaxHeadDim = 256;
// inp (B, T, 3C), out (B, T, C) in `dtype` (read widened, written rounded once); lse (B, NH, T) fp32; C = NH * HS.
absl::Status attention_forward(int device, void* out, float* lse, const void* inp, DType dtype, int64_t b, int64_t t,
                               int64_t nh, int64_t hs);
absl::Status attention_backward(int device, void* dinp, const void* dout, const void* inp, const void* out,
                                const float* lse, DType dtype, int64_t b, int64_t t, int64_t nh, int64_t hs);
// Whether bf16/fp16 attention goes through cuDNN's fused attention (cudnn_attention.h), where this build has it and
// cuDNN takes the shape, rather than the tiled kernels, which fp32 always runs. On unless the environment sets
// ZERO_CUDNN_ATTENTION=0. Process-wide: a backward must run on the path its forward took, so change it between steps.
// Returns the setting it replaces.
bool set_cudnn_attention(bool enabled);

// fp32 -> bf16/fp16 (nearest even, or stochastic when `stochastic` is not null), bf16/fp16 -> fp32, or a copy.
absl::Status cast(int device, void* out, DType to, const void* inp, DType from, int64_t n,
                  const StochasticRounding* stochastic);

// dst += src and x /= divisor over n elements of a floating dtype, in fp32 and rounded once to it (src in that dtype
// or fp32, src_dtype: an fp32 src must not overlap dst); fill_zero clears nbytes.
absl::Status add_into(int device, void* dst, const void* src, DType dtype, DType src_dtype, int64_t n);
absl::Status divide_by(int device, void* x, DType dtype, int64_t n, float divisor);
absl::Status fill_zero(int device, void* x, int64_t nbytes);

}  // namespace zero::kernels::cuda
