// The MLP's layers on the module contract (see mlp.h), on ctx.device.
#include "models/mlp.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"
#include "runtime/status.h"

namespace zero {

// Layer i: y = x W^T + b, then GELU for all but the last layer, which ends in the loss.
class MlpLayer final : public Unit {
 public:
  MlpLayer(int64_t index, int64_t in, int64_t out, bool last, GradRelay& relay)
      : name_(absl::StrCat("fc", index)), first_(index == 0), last_(last), in_(in), out_(out), relay_(relay) {}

  absl::string_view name() const override { return name_; }

  std::vector<ParamSpec> param_specs() const override {
    return {{"weight", {out_, in_}, Init::normal(1.0f / std::sqrt(static_cast<float>(in_)))},
            {"bias", {out_}, Init::zeros()}};
  }

  absl::StatusOr<Tensor> forward(UnitContext& ctx, const ParamViews& p, const Tensor& x) override {
    const DType dtype = p.at("weight").dtype();
    const Tensor& in = first_ ? ctx.batch.inputs : x;
    if (first_) ZERO_RETURN_IF_ERROR(check_on_device(in, ctx.device, "the MLP's inputs (ctx.batch.inputs)"));
    const DType want = first_ ? DType::kF32 : dtype;
    if (in.dtype() != want || in.dim() != 2 || in.size(1) != in_) {
      return absl::InvalidArgumentError(absl::StrCat("MLP layer ", name_, " takes ", dtype_name(want), " (B, ", in_,
                                                     ") inputs; got ", in.to_string()));
    }
    const int64_t B = in.size(0);
    // Hidden layers keep pre (GELU's input) and act (the output); the last keeps logits and dlogits. The first layer
    // of a bf16/fp16 model keeps its fp32 inputs rounded to that dtype, as x_.
    std::vector<TensorSlot> saved = {{&pre_, {B, out_}, dtype}, {&act_, {B, out_}, dtype}};
    const bool rounds_inputs = first_ && dtype != DType::kF32;
    if (rounds_inputs) saved.push_back({&x_, in.shape(), dtype});
    ZERO_ASSIGN_OR_RETURN(saved_, allocate_tensors(ctx.allocator, MemoryCategory::kActivations, ctx.device, saved));
    if (rounds_inputs) {
      ZERO_RETURN_IF_ERROR(kernels::cast(x_, in));
    } else {
      x_ = in;
    }
    ZERO_RETURN_IF_ERROR(kernels::matmul_forward(pre_, x_, p.at("weight"), p.at("bias"), fp32_gemm(ctx)));
    if (!last_) {
      ZERO_RETURN_IF_ERROR(kernels::gelu_forward(act_, pre_));
      return act_;
    }
    ZERO_RETURN_IF_ERROR(classifier_loss(ctx, act_, pre_, out_));
    return pre_;
  }

  void release_saved() override { saved_.reset(); }

  absl::StatusOr<Tensor> backward(UnitContext& ctx, const ParamViews& p, const ParamViews& g,
                                  const Tensor& dy) override {
    // d(pre): the loss's gradient for the last layer; else GELU's backward, written over act_, which
    // the next layer's backward (already run) was the last to read.
    if (!last_) ZERO_RETURN_IF_ERROR(kernels::gelu_backward(act_, pre_, dy));
    Tensor dx;  // Tensor(): the first layer has no input gradient to compute
    if (!first_) {
      ZERO_ASSIGN_OR_RETURN(dx, relay_.allocate_dx(ctx.allocator, ctx.device, x_.shape(), x_.dtype()));
    }
    ZERO_RETURN_IF_ERROR(
        kernels::matmul_backward(dx, g.at("weight"), g.at("bias"), act_, x_, p.at("weight"), fp32_gemm(ctx)));
    saved_.reset();
    relay_.hand_off();
    return dx;
  }

 private:
  const std::string name_;
  const bool first_, last_;
  const int64_t in_, out_;
  GradRelay& relay_;
  Tensor x_;  // (B, in): the batch's inputs (rounded to the layer's dtype) or the previous layer's output
  Buffer saved_;
  Tensor pre_, act_;  // (B, out)
};

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::create(std::vector<int64_t> widths) {
  if (widths.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("an MLP needs at least two widths (inputs and classes); got ", widths.size()));
  }
  for (size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("MLP width ", i, " is ", widths[i], "; it must be positive"));
    }
  }
  return std::unique_ptr<Mlp>(new Mlp(std::move(widths)));
}

Mlp::Mlp(std::vector<int64_t> widths) : widths_(std::move(widths)) {
  const int64_t n = static_cast<int64_t>(widths_.size()) - 1;
  for (int64_t i = 0; i < n; ++i) {
    layers_.push_back(std::make_unique<MlpLayer>(i, widths_[i], widths_[i + 1], i + 1 == n, relay_));
  }
}

Mlp::~Mlp() = default;

std::vector<Unit*> Mlp::units() {
  std::vector<Unit*> out;
  for (const auto& layer : layers_) out.push_back(layer.get());
  return out;
}

}  // namespace zero
