// GPT-2's units on the module contract (see gpt2.h): embedding, transformer blocks and the tied head, on ctx.device.
#include "models/gpt2.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"
#include "runtime/status.h"

namespace zero {
namespace {

// The specs gpt2_unit_params gives unit `index` (0: embedding, 1..L: blocks, L+1: head).
std::vector<ParamSpec> unit_specs(const Gpt2Config& config, size_t index) {
  return std::move(gpt2_unit_params(config)[index].params);
}

// tokens: int32 (B, T) on `device`, T <= maxT, every token in [0, V) (wte's padding rows V..Vp-1 are no
// tokens). On a device they are read in `host_tokens` (the batch's host copy), or else copied back, which waits
// for the device's queued work.
absl::Status check_tokens(const Gpt2Config& config, const Tensor& tokens, const Tensor& host_tokens, Device device) {
  ZERO_RETURN_IF_ERROR(check_on_device(tokens, device, "GPT-2's tokens (ctx.batch.inputs)"));
  if (tokens.dtype() != DType::kI32 || tokens.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPT-2 takes int32 tokens of shape (B, T); got ", tokens.to_string()));
  }
  if (tokens.size(1) > config.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPT-2 sequence length T = ", tokens.size(1), " exceeds max_seq_len ", config.max_seq_len,
                     "; cut the batch to at most ", config.max_seq_len, " tokens per row or raise max_seq_len"));
  }
  std::vector<int32_t> host_copy;
  ZERO_ASSIGN_OR_RETURN(const int32_t* token, kernels::int32_on_host(tokens, host_tokens, host_copy));
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    if (token[i] < 0 || token[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("GPT-2 token ", token[i], " at (", i / tokens.size(1), ", ",
                                                     i % tokens.size(1), ") is outside the vocabulary [0, ",
                                                     config.vocab_size, "); was the data tokenized for this model?"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// x (B, T, C) = wte[tokens] + wpe[t].
class Gpt2Embedding final : public Unit {
 public:
  Gpt2Embedding(const Gpt2Config& config, GradRelay& relay)
      : config_(config), specs_(unit_specs(config, 0)), relay_(relay) {}

  absl::string_view name() const override { return kGpt2EmbeddingUnit; }
  std::vector<ParamSpec> param_specs() const override { return specs_; }

  absl::StatusOr<Tensor> forward(UnitContext& ctx, const ParamViews& params, const Tensor&) override {
    const Tensor& tokens = ctx.batch.inputs;
    ZERO_RETURN_IF_ERROR(check_tokens(config_, tokens, ctx.batch.host_inputs, ctx.device));
    const Shape shape = {tokens.size(0), tokens.size(1), config_.channels};
    ZERO_ASSIGN_OR_RETURN(saved_, allocate_tensors(ctx.allocator, MemoryCategory::kActivations, ctx.device,
                                                   {{&out_, shape, params.at("wte.weight").dtype()}}));
    ZERO_RETURN_IF_ERROR(kernels::embedding_forward(out_, tokens, params.at("wte.weight"), params.at("wpe.weight"),
                                                    ctx.batch.host_inputs));
    return out_;
  }

  void release_saved() override { saved_.reset(); }

  absl::StatusOr<Tensor> backward(UnitContext& ctx, const ParamViews&, const ParamViews& grads,
                                  const Tensor& dy) override {
    ZERO_RETURN_IF_ERROR(kernels::embedding_backward(grads.at("wte.weight"), grads.at("wpe.weight"), dy,
                                                     ctx.batch.inputs, ctx.batch.host_inputs));
    saved_.reset();
    relay_.hand_off();
    return Tensor();
  }

 private:
  const Gpt2Config config_;
  const std::vector<ParamSpec> specs_;
  GradRelay& relay_;
  Buffer saved_;
  Tensor out_;
};

// A pre-LayerNorm transformer block: x2 = x + attn(ln_1(x)); y = x2 + mlp(ln_2(x2)).
class Gpt2Block final : public Unit {
 public:
  Gpt2Block(const Gpt2Config& config, int64_t layer, GradRelay& relay)
      : config_(config), name_(gpt2_block_unit(layer)), specs_(unit_specs(config, layer + 1)), relay_(relay) {}

  absl::string_view name() const override { return name_; }
  std::vector<ParamSpec> param_specs() const override { return specs_; }
  void set_recompute(bool recompute) { recompute_ = recompute; }

  absl::StatusOr<Tensor> forward(UnitContext& ctx, const ParamViews& p, const Tensor& x) override {
    x_ = x;
    ZERO_ASSIGN_OR_RETURN(out_buffer_, allocate_tensors(ctx.allocator, MemoryCategory::kActivations, ctx.device,
                                                        {{&out_, x.shape(), x.dtype()}}));
    ZERO_RETURN_IF_ERROR(compute_activations(ctx, p));
    // y (B, T, C) = x2 + fc_gelu · mlp.c_proj^T + b, the residual added before the one rounding
    ZERO_RETURN_IF_ERROR(kernels::matmul_residual_forward(out_, a_.fc_gelu, p.at("mlp.c_proj.weight"),
                                                          p.at("mlp.c_proj.bias"), a_.x2, fp32_gemm(ctx)));
    if (recompute_) saved_.reset();
    return out_;
  }

  void release_saved() override {
    saved_.reset();
    out_buffer_.reset();
  }

  absl::StatusOr<Tensor> backward(UnitContext& ctx, const ParamViews& p, const ParamViews& g,
                                  const Tensor& dy) override {
    if (recompute_) ZERO_RETURN_IF_ERROR(compute_activations(ctx, p));
    const Shape& shape = x_.shape();  // (B, T, C)
    const Shape wide = {shape[0], shape[1], 4 * config_.channels};
    const DType dtype = x_.dtype();
    // Scratch, each buffer reused once its gradient is consumed: d4c holds d(fc) then d(qkv) (3C of its
    // 4C), dc holds d(ln_2 out), d(attention out), d(ln_1 out) in turn; dx2 = d(x2).
    Tensor d4c, dc, dx2;
    ZERO_ASSIGN_OR_RETURN(Buffer scratch,
                          allocate_tensors(ctx.allocator, MemoryCategory::kWorkspace, ctx.device,
                                           {{&d4c, wide, dtype}, {&dc, shape, dtype}, {&dx2, shape, dtype}}));
    const Tensor dqkv = d4c.view(0, {shape[0], shape[1], 3 * config_.channels});
    // MLP: y = x2 + c_proj(gelu(c_fc(ln_2(x2)))).
    ZERO_RETURN_IF_ERROR(kernels::matmul_backward_through_gelu(d4c, g.at("mlp.c_proj.weight"), g.at("mlp.c_proj.bias"),
                                                               dy, a_.fc_gelu, a_.fc, p.at("mlp.c_proj.weight"),
                                                               fp32_gemm(ctx)));
    ZERO_RETURN_IF_ERROR(kernels::matmul_backward(dc, g.at("mlp.c_fc.weight"), g.at("mlp.c_fc.bias"), d4c, a_.ln2,
                                                  p.at("mlp.c_fc.weight"), fp32_gemm(ctx)));
    ZERO_RETURN_IF_ERROR(kernels::layernorm_backward(dx2, g.at("ln_2.weight"), g.at("ln_2.bias"), dc, a_.x2,
                                                     p.at("ln_2.weight"), a_.ln2_mean, a_.ln2_rstd, /*dresidual=*/dy));
    // Attention: x2 = x + c_proj(attn(c_attn(ln_1(x)))).
    ZERO_RETURN_IF_ERROR(kernels::matmul_backward(dc, g.at("attn.c_proj.weight"), g.at("attn.c_proj.bias"), dx2,
                                                  a_.atty, p.at("attn.c_proj.weight"), fp32_gemm(ctx)));
    ZERO_RETURN_IF_ERROR(kernels::attention_backward(dqkv, dc, a_.qkv, a_.atty, a_.lse, config_.num_heads));
    ZERO_RETURN_IF_ERROR(kernels::matmul_backward(dc, g.at("attn.c_attn.weight"), g.at("attn.c_attn.bias"), dqkv,
                                                  a_.ln1, p.at("attn.c_attn.weight"), fp32_gemm(ctx)));
    ZERO_ASSIGN_OR_RETURN(Tensor dx, relay_.allocate_dx(ctx.allocator, ctx.device, shape, dtype));
    ZERO_RETURN_IF_ERROR(kernels::layernorm_backward(dx, g.at("ln_1.weight"), g.at("ln_1.bias"), dc, x_,
                                                     p.at("ln_1.weight"), a_.ln1_mean, a_.ln1_rstd, /*dresidual=*/dx2));
    saved_.reset();
    out_buffer_.reset();
    relay_.hand_off();
    return dx;
  }

 private:
  // What backward reads, (B, T, ·) unless marked; in x_'s dtype but for the fp32 statistics (the LayerNorms' mean
  // and rstd, attention's lse).
  struct Activations {
    Tensor ln1, ln1_mean, ln1_rstd;  // (B, T, C), (B, T), (B, T)
    Tensor qkv;                      // (B, T, 3C)
    Tensor atty, lse;                // (B, T, C), (B, NH, T)
    Tensor x2;                       // (B, T, C): x + attention
    Tensor ln2, ln2_mean, ln2_rstd;
    Tensor fc, fc_gelu;  // (B, T, 4C)
  };

  // Allocates and computes everything up to the MLP's hidden activation, from x_.
  absl::Status compute_activations(UnitContext& ctx, const ParamViews& p) {
    const int64_t B = x_.size(0), T = x_.size(1), C = config_.channels;
    const DType dt = x_.dtype();
    ZERO_ASSIGN_OR_RETURN(saved_, allocate_tensors(ctx.allocator, MemoryCategory::kActivations, ctx.device,
                                                   {{&a_.ln1, {B, T, C}, dt},
                                                    {&a_.ln1_mean, {B, T}, DType::kF32},
                                                    {&a_.ln1_rstd, {B, T}, DType::kF32},
                                                    {&a_.qkv, {B, T, 3 * C}, dt},
                                                    {&a_.atty, {B, T, C}, dt},
                                                    {&a_.lse, {B, config_.num_heads, T}, DType::kF32},
                                                    {&a_.x2, {B, T, C}, dt},
                                                    {&a_.ln2, {B, T, C}, dt},
                                                    {&a_.ln2_mean, {B, T}, DType::kF32},
                                                    {&a_.ln2_rstd, {B, T}, DType::kF32},
                                                    {&a_.fc, {B, T, 4 * C}, dt},
                                                    {&a_.fc_gelu, {B, T, 4 * C}, dt}}));
    ZERO_RETURN_IF_ERROR(
        kernels::layernorm_forward(a_.ln1, a_.ln1_mean, a_.ln1_rstd, x_, p.at("ln_1.weight"), p.at("ln_1.bias")));
    ZERO_RETURN_IF_ERROR(
        kernels::matmul_forward(a_.qkv, a_.ln1, p.at("attn.c_attn.weight"), p.at("attn.c_attn.bias"), fp32_gemm(ctx)));
    ZERO_RETURN_IF_ERROR(kernels::attention_forward(a_.atty, a_.lse, a_.qkv, config_.num_heads));
    ZERO_RETURN_IF_ERROR(
        kernels::matmul_forward(a_.x2, a_.atty, p.at("attn.c_proj.weight"), p.at("attn.c_proj.bias"), fp32_gemm(ctx)));
    ZERO_RETURN_IF_ERROR(kernels::residual_layernorm_forward(a_.ln2, a_.ln2_mean, a_.ln2_rstd, a_.x2, x_,
                                                             p.at("ln_2.weight"), p.at("ln_2.bias")));  // x2 += x
    return kernels::matmul_gelu_forward(a_.fc_gelu, a_.fc, a_.ln2, p.at("mlp.c_fc.weight"), p.at("mlp.c_fc.bias"),
                                        fp32_gemm(ctx));
  }

  const Gpt2Config config_;
  const std::string name_;
  const std::vector<ParamSpec> specs_;
  GradRelay& relay_;
  bool recompute_ = false;
  Tensor x_;  // (B, T, C): the previous unit's output, valid until after this backward
  Buffer out_buffer_;
  Tensor out_;  // (B, T, C)
  Buffer saved_;
  Activations a_;
};

// logits (B, T, Vp) = ln_f(x) · wte^T, and the loss over the real vocab.
class Gpt2Head final : public Unit {
 public:
  Gpt2Head(const Gpt2Config& config, GradRelay& relay)
      : config_(config), specs_(unit_specs(config, config.num_layers + 1)), relay_(relay) {}

  absl::string_view name() const override { return kGpt2HeadUnit; }
  std::vector<ParamSpec> param_specs() const override { return specs_; }
  std::vector<TiedParam> tied_params() const override { return {{std::string(kGpt2EmbeddingUnit), "wte.weight"}}; }

  absl::StatusOr<Tensor> forward(UnitContext& ctx, const ParamViews& p, const Tensor& x) override {
    x_ = x;
    const int64_t B = x.size(0), T = x.size(1), C = config_.channels, Vp = config_.padded_vocab_size;
    const DType dt = x.dtype();
    // The logits' gradient over the logits themselves, unless the caller reads them (UnitContext::output_read); none
    // where no backward follows.
    std::vector<TensorSlot> saved = {{&lnf_, {B, T, C}, dt},
                                     {&mean_, {B, T}, DType::kF32},
                                     {&rstd_, {B, T}, DType::kF32},
                                     {&logits_, {B, T, Vp}, dt}};
    const bool apart = ctx.output_read && ctx.backward_follows;
    if (apart) saved.push_back({&dlogits_, {B, T, Vp}, dt});
    ZERO_ASSIGN_OR_RETURN(saved_, allocate_tensors(ctx.allocator, MemoryCategory::kActivations, ctx.device, saved));
    if (!apart) dlogits_ = ctx.backward_follows ? logits_ : Tensor();
    ZERO_RETURN_IF_ERROR(kernels::layernorm_forward(lnf_, mean_, rstd_, x, p.at("ln_f.weight"), p.at("ln_f.bias")));
    ZERO_RETURN_IF_ERROR(kernels::matmul_forward(logits_, lnf_, p.at("wte.weight"), Tensor(), fp32_gemm(ctx)));
    ZERO_RETURN_IF_ERROR(classifier_loss(ctx, dlogits_, logits_, config_.vocab_size));
    return logits_;
  }

  void release_saved() override { saved_.reset(); }

  absl::StatusOr<Tensor> backward(UnitContext& ctx, const ParamViews& p, const ParamViews& g, const Tensor&) override {
    Tensor dlnf;
    ZERO_ASSIGN_OR_RETURN(Buffer scratch, allocate_tensors(ctx.allocator, MemoryCategory::kWorkspace, ctx.device,
                                                           {{&dlnf, x_.shape(), x_.dtype()}}));
    ZERO_RETURN_IF_ERROR(kernels::matmul_backward(dlnf, g.at("wte.weight"), Tensor(), dlogits_, lnf_,
                                                  p.at("wte.weight"), fp32_gemm(ctx)));
    ZERO_ASSIGN_OR_RETURN(Tensor dx, relay_.allocate_dx(ctx.allocator, ctx.device, x_.shape(), x_.dtype()));
    ZERO_RETURN_IF_ERROR(kernels::layernorm_backward(dx, g.at("ln_f.weight"), g.at("ln_f.bias"), dlnf, x_,
                                                     p.at("ln_f.weight"), mean_, rstd_));
    saved_.reset();
    relay_.hand_off();
    return dx;
  }

 private:
  const Gpt2Config config_;
  const std::vector<ParamSpec> specs_;
  GradRelay& relay_;
  Tensor x_;  // (B, T, C)
  Buffer saved_;
  Tensor lnf_, mean_, rstd_;  // (B, T, C), (B, T), (B, T) fp32 statistics
  Tensor logits_, dlogits_;   // (B, T, Vp); one buffer unless the forward's caller reads the logits
};

int64_t gpt2_peak_activation_bytes(const Gpt2Config& config, int64_t B, int64_t T, bool recompute, DType dtype) {
  const int64_t e = dtype_size(dtype), bt = B * T, btc = bt * config.channels, layers = config.num_layers;
  const int64_t block_saved = e * 15 * btc + 4 * (4 * bt + B * config.num_heads * T);
  const int64_t head = e * (btc + bt * config.padded_vocab_size) + 4 * 2 * bt;  // the gradient over the logits
  const int64_t outputs = e * (layers + 1) * btc;                               // the embedding's and every block's
  return recompute ? outputs + std::max(block_saved, head) : outputs + layers * block_saved + head;
}

absl::StatusOr<std::unique_ptr<Gpt2>> Gpt2::create(const Gpt2Config& config) {
  ZERO_RETURN_IF_ERROR(config.validate());
  return std::unique_ptr<Gpt2>(new Gpt2(config));
}

Gpt2::Gpt2(const Gpt2Config& config)
    : config_(config), embedding_(std::make_unique<Gpt2Embedding>(config, relay_)),
      head_(std::make_unique<Gpt2Head>(config, relay_)) {
  for (int64_t l = 0; l < config.num_layers; ++l) blocks_.push_back(std::make_unique<Gpt2Block>(config, l, relay_));
}

Gpt2::~Gpt2() = default;

std::vector<Unit*> Gpt2::units() {
  std::vector<Unit*> out = {embedding_.get()};
  for (const auto& block : blocks_) out.push_back(block.get());
  out.push_back(head_.get());
  return out;
}

void Gpt2::set_recompute(int64_t layer, bool recompute) {
  ZERO_CHECK(layer >= 0 && layer < config_.num_layers, "layer ", layer, " out of range [0, ", config_.num_layers, ")");
  blocks_[layer]->set_recompute(recompute);
}

}  // namespace zero
