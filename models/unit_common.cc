#include "models/unit_common.h"

#include <utility>

#include "kernels/kernels.h"
#include "runtime/status.h"

namespace zero {
namespace {

constexpr int64_t kAlignFloats = 16;  // 64 bytes

int64_t aligned(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

}  // namespace

absl::StatusOr<Buffer> allocate_tensors(Allocator& allocator, MemoryCategory category,
                                        std::initializer_list<TensorSlot> slots) {
  int64_t floats = 0;
  for (const TensorSlot& slot : slots) floats += aligned(shape_numel(slot.shape));
  ZERO_ASSIGN_OR_RETURN(Buffer buffer, allocator.allocate(floats * 4, category));
  Tensor all = buffer.tensor(DType::kF32, {floats});
  int64_t offset = 0;
  for (const TensorSlot& slot : slots) {
    *slot.tensor = all.view(offset, slot.shape);
    offset += aligned(shape_numel(slot.shape));
  }
  return buffer;
}

absl::StatusOr<Tensor> GradRelay::allocate_dx(Allocator& allocator, const Shape& shape) {
  Tensor dx;
  ZERO_ASSIGN_OR_RETURN(dx_, allocate_tensors(allocator, MemoryCategory::kWorkspace, {{&dx, shape}}));
  return dx;
}

void GradRelay::hand_off() {
  dy_ = std::move(dx_);  // frees the old dy; dx_ is left empty
}

absl::Status classifier_loss(UnitContext& ctx, const Tensor& dlogits, const Tensor& logits, int64_t classes) {
  ZERO_ASSIGN_OR_RETURN(kernels::CrossEntropyResult ce,
                        kernels::crossentropy_forward_backward(dlogits, logits, ctx.batch.targets, classes));
  if (ctx.loss_scale != 1.0f) {
    float* d = dlogits.data_as<float>();
    for (int64_t i = 0; i < dlogits.numel(); ++i) d[i] *= ctx.loss_scale;
  }
  ctx.loss = ce.loss;
  ctx.correct = ce.correct;
  ctx.predictions = ce.counted;
  return absl::OkStatus();
}

}  // namespace zero
