// What model units share: accounted activation carving, the input-gradient relay, the loss.
#pragma once

// Everything here runs on the device a unit is told to (UnitContext::device): buffers are allocated there and
// every read or write of tensor memory goes through the device-dispatching kernels (kernels/kernels.h), so
// the same code serves CPU and CUDA tensors. The only host values are the loss and the accuracy counts: in
// training the cross-entropy leaves them on the device for the engine to read once per step, in evaluation it
// returns them by value (copied back from the device, waiting for it).

#include <initializer_list>
#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/kernels.h"
#include "runtime/allocator.h"
#include "runtime/tensor.h"
#include "shard/module.h"

namespace zero {

struct TensorSlot {
  Tensor* tensor;  // set to a contiguous view of `shape` in `dtype`
  Shape shape;
  DType dtype;
};

// One allocation of `category` on `device` holding every slot's tensor, each 64-byte aligned and on
// `device`. The views are valid while the returned Buffer lives.
absl::StatusOr<Buffer> allocate_tensors(Allocator& allocator, MemoryCategory category, Device device,
                                        std::span<const TensorSlot> slots);
inline absl::StatusOr<Buffer> allocate_tensors(Allocator& allocator, MemoryCategory category, Device device,
                                               std::initializer_list<TensorSlot> slots) {
  return allocate_tensors(allocator, category, device, std::span<const TensorSlot>(slots.begin(), slots.size()));
}

// InvalidArgument unless `tensor` lives on `device`, the device the unit runs on; `what` names the tensor in
// the message (e.g. "GPT-2's tokens (ctx.batch.inputs)").
absl::Status check_on_device(const Tensor& tensor, Device device, absl::string_view what);

// Owns d(loss)/d(x) as units' backwards return it, shared by the units of one model. A unit's backward
// allocates its dx here (the dy it was handed, the next unit's dx, stays alive), and calls hand_off()
// when done, which frees that dy: at most two such buffers live at a time, none after the first unit's
// backward. Buffers are kWorkspace, on the device the units run on.
class GradRelay {
 public:
  absl::StatusOr<Tensor> allocate_dx(Allocator& allocator, Device device, const Shape& shape, DType dtype);
  void hand_off();

 private:
  Buffer dy_;  // the dy of the backward running now
  Buffer dx_;  // the dx it is writing
};

// A classifier head's loss: fused softmax cross-entropy over the first `classes` columns of logits (N, Cp)
// against ctx.batch.targets (N) int32 on ctx.device (kIgnoreIndex rows skipped), dlogits (N, Cp) =
// d(loss)/d(logits) times ctx.loss_scale (undefined: the loss alone, where no backward follows). ctx.predictions is set
// at once (the targets are counted on the host); the loss and correct count go to ctx.loss_sums on the device where the
// engine gives a slot (training), or are read back into ctx.loss and ctx.correct (evaluation, which so waits for the
// device).
absl::Status classifier_loss(UnitContext& ctx, const Tensor& dlogits, const Tensor& logits, int64_t classes);

// How the unit's fp32 GEMMs run: TF32 where the engine allows it (UnitContext::tf32).
inline kernels::Fp32Gemm fp32_gemm(const UnitContext& ctx) {
  return ctx.tf32 ? kernels::Fp32Gemm::kTf32 : kernels::Fp32Gemm::kExact;
}

}  // namespace zero
