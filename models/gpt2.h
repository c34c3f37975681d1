// GPT-2 on the module contract: an embedding unit, one unit per transformer block, and a head with the tied wte.
#pragma once

// Units (see gpt2_config.h for their parameters), inputs int32 tokens (B, T) with T <= maxT, targets int32
// next tokens (B, T) (kernels::kIgnoreIndex: no loss):
//   "embedding"  x (B, T, C) = wte[tokens] + wpe[t]
//   "h.{i}"      pre-LayerNorm block: x += attn(ln_1(x)); x += mlp(ln_2(x)), causal attention, GELU (tanh)
//   "head"       logits (B, T, Vp) = ln_f(x) wte^T (wte tied from "embedding"); loss over the real vocab
// Tokens and targets must be on ctx.device, where the units run. The tokens are checked, and wte's gradient rows
// grouped on CUDA, on the host: in the batch's host copy (Batch::host_inputs), or else in a copy back from the
// device, which waits for its queued work; the loss stays on the device in training (classifier_loss).
// Every unit computes in its parameters' dtype (the engine's precision: fp32, bf16 or fp16), the kernels' training
// precision (kernels/kernels.h): activations, scratch and input gradients are in that dtype, e bytes an element, but
// for the fp32 statistics (LayerNorm's mean and rstd, attention's log-sum-exp, 4 bytes an element). Parameters and
// gradients go to the kernels as the engine holds them; each kernel adds its gradient in fp32 and rounds it once.
// Memory on ctx.device, in elements (every tensor starts 64-byte aligned; with B·T a multiple of 16 and C and Vp
// even nothing pads):
//   kActivations, each unit's from its forward to the end of its backward:
//     embedding  B·T·C                          its output
//     h.{i}      B·T·C                          its output
//                + 15·B·T·C                     saved: ln_1, qkv (3C), attention out, x + attention, ln_2, the MLP
//                                               hidden before and after GELU (4C each)
//                + 4·B·T + B·NH·T (fp32)        both LayerNorms' mean and rstd; attention's log-sum-exp
//     head       B·T·C + B·T·Vp                 ln_f and the logits, which the loss overwrites with their gradient
//                + 2·B·T (fp32)                 ln_f's mean and rstd
//                                               (llm.c's fused classifier; another B·T·Vp where the forward's
//                                               caller reads the logits and a backward follows; none in
//                                               evaluation, which computes the loss alone)
//   so the peak in training, at the end of forward, is e·((L+2)·B·T·C + 15·L·B·T·C + B·T·Vp)
//   + 4·(L·(4·B·T + B·NH·T) + 2·B·T) bytes.
//   A block set to recompute holds only its output between forward and backward; what it saves lives only
//   while it computes it (in forward, and again at the start of its backward). The kernels are
//   deterministic, so its gradients are bit-identical to saving.
//   kWorkspace: a block's backward scratch (6·B·T·C), the head's (B·T·C), and the input gradient each
//   backward returns (B·T·C, freed when the unit before has used it). The CPU's GEMMs and attention in bf16/fp16
//   widen their operands into host scratch of their own (kernels/widened.h), outside the allocator.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt2_config.h"
#include "models/unit_common.h"
#include "shard/module.h"

namespace zero {

class Gpt2Embedding;
class Gpt2Block;
class Gpt2Head;

// The peak kActivations bytes of one forward+backward over (B, T) computing in `dtype`, from the table above: every
// block saving (the peak at the end of forward), or every block recomputing (the outputs, plus one block's saved
// tensors or the head's, whichever is larger). Exact when B·T and B·NH·T are multiples of 16 and C and Vp even.
int64_t gpt2_peak_activation_bytes(const Gpt2Config& config, int64_t B, int64_t T, bool recompute, DType dtype);

class Gpt2 final : public Model {
 public:
  // Fails if config.validate() does.
  static absl::StatusOr<std::unique_ptr<Gpt2>> create(const Gpt2Config& config);
  ~Gpt2() override;

  std::vector<Unit*> units() override;
  const Gpt2Config& config() const { return config_; }
  // Whether block `layer` recomputes its activations in backward instead of saving them (default: saves).
  void set_recompute(int64_t layer, bool recompute);

 private:
  explicit Gpt2(const Gpt2Config& config);

  Gpt2Config config_;
  GradRelay relay_;
  std::unique_ptr<Gpt2Embedding> embedding_;
  std::vector<std::unique_ptr<Gpt2Block>> blocks_;
  std::unique_ptr<Gpt2Head> head_;
};

}  // namespace zero
