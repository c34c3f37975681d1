// What model units share (see unit_common.h): activation carving, fp32 views, the gradient relay, the loss.
#include "models/unit_common.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"
#include "runtime/status.h"

namespace zero {
namespace {

constexpr int64_t kAlignFloats = 16;  // 64 bytes

int64_t aligned(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

}  // namespace

absl::StatusOr<Buffer> allocate_tensors(Allocator& allocator, MemoryCategory category, Device device,
                                        std::span<const TensorSlot> slots) {
  int64_t floats = 0;
  for (const TensorSlot& slot : slots) floats += aligned(shape_numel(slot.shape));
  ZERO_ASSIGN_OR_RETURN(Buffer buffer, allocator.allocate(floats * 4, category, device));
  Tensor all = buffer.tensor(DType::kF32, {floats});  // Buffer::tensor gives it the buffer's device
  int64_t offset = 0;
  for (const TensorSlot& slot : slots) {
    *slot.tensor = all.view(offset, slot.shape);
    offset += aligned(shape_numel(slot.shape));
  }
  return buffer;
}

absl::Status check_on_device(const Tensor& tensor, Device device, absl::string_view what) {
  if (tensor.device() == device) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " is on ", tensor.device().to_string(), " but the unit runs on ",
                                                 device.to_string(), " (UnitContext::device); put it on ",
                                                 device.to_string()));
}

absl::StatusOr<Fp32Views> Fp32Views::widen(Allocator& allocator, Device device, const ParamViews& views,
                                           const std::vector<std::string>& names) {
  Fp32Views out;
  std::vector<Tensor> copies(names.size());
  std::vector<TensorSlot> slots;
  for (size_t i = 0; i < names.size(); ++i) {
    const Tensor& view = views.at(names[i]);
    ZERO_RETURN_IF_ERROR(check_on_device(view, device, absl::StrCat("the view '", names[i], "'")));
    if (view.dtype() == DType::kF32) {
      out.fp32_.set(names[i], view);
    } else {
      slots.push_back({&copies[i], view.shape()});
    }
  }
  if (slots.empty()) return out;
  ZERO_ASSIGN_OR_RETURN(out.buffer_, allocate_tensors(allocator, MemoryCategory::kWorkspace, device, slots));
  for (size_t i = 0; i < names.size(); ++i) {
    if (copies[i].data() == nullptr) continue;  // passed through as fp32
    ZERO_RETURN_IF_ERROR(kernels::cast(copies[i], views.at(names[i])));
    out.fp32_.set(names[i], copies[i]);
    out.widened_.emplace_back(views.at(names[i]), copies[i]);
  }
  return out;
}

absl::Status Fp32Views::round_back() const {
  for (const auto& [view, copy] : widened_) ZERO_RETURN_IF_ERROR(kernels::cast(view, copy));
  return absl::OkStatus();
}

std::vector<std::string> view_names(const std::vector<ParamSpec>& specs, const std::vector<TiedParam>& tied) {
  std::vector<std::string> names;
  for (const ParamSpec& spec : specs) names.push_back(spec.name);
  for (const TiedParam& t : tied) names.push_back(t.param);
  return names;
}

absl::StatusOr<Tensor> GradRelay::allocate_dx(Allocator& allocator, Device device, const Shape& shape) {
  Tensor dx;
  ZERO_ASSIGN_OR_RETURN(dx_, allocate_tensors(allocator, MemoryCategory::kWorkspace, device, {{&dx, shape}}));
  return dx;
}

void GradRelay::hand_off() {
  dy_ = std::move(dx_);  // frees the old dy; dx_ is left empty
}

absl::Status classifier_loss(UnitContext& ctx, const Tensor& dlogits, const Tensor& logits, int64_t classes) {
  ZERO_RETURN_IF_ERROR(check_on_device(ctx.batch.targets, ctx.device, "the targets (ctx.batch.targets)"));
  // The targets are checked on the host, in the batch's host copy where it has one. In training the sums stay in
  // the engine's slot on the device; in evaluation they are read back now, waiting for the device.
  if (ctx.loss_sums.data() != nullptr) {
    ZERO_ASSIGN_OR_RETURN(ctx.predictions,
                          kernels::crossentropy_forward_backward_into(ctx.loss_sums, dlogits, logits, ctx.batch.targets,
                                                                      classes, ctx.batch.host_targets, ctx.loss_scale));
    ctx.loss_sums_written = true;
  } else {
    ZERO_ASSIGN_OR_RETURN(const kernels::CrossEntropyResult ce,
                          kernels::crossentropy_forward_backward(dlogits, logits, ctx.batch.targets, classes,
                                                                 ctx.batch.host_targets, ctx.loss_scale));
    ctx.loss = ce.loss;
    ctx.correct = ce.correct;
    ctx.predictions = ce.counted;
  }
  return absl::OkStatus();
}

}  // namespace zero
