// What the model units share: activations carved from one accounted allocation, the relay that keeps each backward's input gradient alive, the classifier loss.
#pragma once

#include <initializer_list>

#include "absl/status/statusor.h"
#include "runtime/allocator.h"
#include "runtime/tensor.h"
#include "shard/module.h"

namespace zero {

struct TensorSlot {
  Tensor* tensor;  // set to a contiguous fp32 view of `shape`
  Shape shape;
};

// One allocation of `category` holding every slot's tensor, each 64-byte aligned. The views are valid
// while the returned Buffer lives.
absl::StatusOr<Buffer> allocate_tensors(Allocator& allocator, MemoryCategory category,
                                        std::initializer_list<TensorSlot> slots);

// Owns d(loss)/d(x) as units' backwards return it, shared by the units of one model. A unit's backward
// allocates its dx here (the dy it was handed, the next unit's dx, stays alive), and calls hand_off()
// when done, which frees that dy: at most two such buffers live at a time, none after the first unit's
// backward. Buffers are kWorkspace.
class GradRelay {
 public:
  absl::StatusOr<Tensor> allocate_dx(Allocator& allocator, const Shape& shape);
  void hand_off();

 private:
  Buffer dy_;  // the dy of the backward running now
  Buffer dx_;  // the dx it is writing
};

// A classifier head's loss: fused softmax cross-entropy over the first `classes` columns of logits (N, Cp)
// against ctx.batch.targets (N) (kIgnoreIndex rows skipped), dlogits (N, Cp) = d(loss)/d(logits) times
// ctx.loss_scale, and ctx.loss, ctx.correct, ctx.predictions set.
absl::Status classifier_loss(UnitContext& ctx, const Tensor& dlogits, const Tensor& logits, int64_t classes);

}  // namespace zero
