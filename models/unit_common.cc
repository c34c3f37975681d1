// What model units share (see unit_common.h): activation carving, the gradient relay, the loss.
#include "models/unit_common.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"
#include "runtime/status.h"

namespace zero {
namespace {

constexpr int64_t kAlignBytes = 64;

int64_t aligned_bytes(const TensorSlot& slot) {
  const int64_t bytes = shape_numel(slot.shape) * dtype_size(slot.dtype);
  return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
}

}  // namespace

absl::StatusOr<Buffer> allocate_tensors(Allocator& allocator, MemoryCategory category, Device device,
                                        std::span<const TensorSlot> slots) {
  int64_t bytes = 0;
  for (const TensorSlot& slot : slots) bytes += aligned_bytes(slot);
  ZERO_ASSIGN_OR_RETURN(Buffer buffer, allocator.allocate(bytes, category, device));
  char* const base = static_cast<char*>(buffer.data());
  int64_t offset = 0;
  for (const TensorSlot& slot : slots) {
    *slot.tensor = Tensor(base + offset, slot.dtype, slot.shape, buffer.device());
    offset += aligned_bytes(slot);
  }
  return buffer;
}

absl::Status check_on_device(const Tensor& tensor, Device device, absl::string_view what) {
  if (tensor.device() == device) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " is on ", tensor.device().to_string(), " but the unit runs on ",
                                                 device.to_string(), " (UnitContext::device); put it on ",
                                                 device.to_string()));
}

absl::StatusOr<Tensor> GradRelay::allocate_dx(Allocator& allocator, Device device, const Shape& shape, DType dtype) {
  Tensor dx;
  ZERO_ASSIGN_OR_RETURN(dx_, allocate_tensors(allocator, MemoryCategory::kWorkspace, device, {{&dx, shape, dtype}}));
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
