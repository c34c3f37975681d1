// The module contract: how a model's units declare parameters and run forward/backward on views the engine hands them.
//
// A model is an ordered list of units (an embedding, a transformer block, a head). The engine owns all
// parameter, gradient and optimizer memory; a unit only declares what it needs and computes:
//
//   for unit in units:            x = unit.forward(ctx, params(unit), x)           // stage 3: gathered just in time
//   for unit in reversed(units):  dy = unit.backward(ctx, params(unit), grads(unit), dy)
//
// skipping, in both loops, a unit that sits this micro-batch out (Unit::runs: conditional models).
//
// No autograd: backward is explicit, as in llm.c. A user's own C++ model implements the same interface
// and runs under any ZeRO stage unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/allocator.h"
#include "runtime/tensor.h"

namespace zero {

// How a parameter starts. GPT-2: weights N(0, 0.02) (residual projections scaled by 1/sqrt(2L)),
// biases zero, LayerNorm gains one.
struct Init {
  enum class Kind : uint8_t { kZeros, kOnes, kNormal };
  Kind kind = Kind::kZeros;
  float std = 0.0f;

  static Init zeros() { return {Kind::kZeros, 0.0f}; }
  static Init ones() { return {Kind::kOnes, 0.0f}; }
  static Init normal(float std) { return {Kind::kNormal, std}; }
};

struct ParamSpec {
  std::string name;  // unique within the unit, e.g. "attn.c_attn.weight"
  Shape shape;
  Init init;
};

// A parameter another unit owns that this unit reads (tied weights: GPT-2's head uses the embedding's
// wte). The engine makes it available under `param` in this unit's views, and counts the owner's
// gradient ready only after every user's backward has added to it.
struct TiedParam {
  std::string owner_unit;  // Unit::name() of the owner
  std::string param;       // the owner's ParamSpec name
};

// Views of one unit's parameters, or of their gradients, by name (tied parameters included). Their
// dtype is the engine's precision (fp32, bf16 or fp16), which a unit computes in (GPT-2 and the MLP: each kernel in
// fp32, rounding what it writes once, kernels/kernels.h).
class ParamViews {
 public:
  void set(std::string name, Tensor view) { views_[std::move(name)] = view; }
  bool contains(absl::string_view name) const { return views_.contains(name); }
  // The view named `name`; asking for a name the unit did not declare is a programmer error.
  const Tensor& at(absl::string_view name) const;

 private:
  absl::flat_hash_map<std::string, Tensor> views_;
};

// One micro-batch of this rank.
struct Batch {
  Tensor inputs;   // int32 tokens (B, T) for GPT-2; fp32 features (B, D) for the MLP
  Tensor targets;  // what the last unit's loss reads: int32 next tokens (B, T), int32 labels (B), or
                   // whatever a user's model needs (the engine never looks inside a batch)
  // The same inputs and targets on the host, where a data pipeline built them before copying them to a device
  // (data::DeviceBatch keeps them): models read token ids and labels there (range checks, the loss's count), so
  // a micro-batch never waits for the device to read them back. Empty when the caller kept none; on the CPU the
  // batch itself is on the host.
  Tensor host_inputs;
  Tensor host_targets;
};

// What forward and backward see besides parameters and the activation stream.
struct UnitContext {
  Allocator& allocator;  // activations (kActivations) and scratch (kWorkspace), accounted per rank
  const Batch& batch;
  Device device = Device::cpu();
  int64_t step = 0;  // optimizer steps taken before this micro-batch (for Unit::runs, dropout seeds)
  // The last unit multiplies the gradient of its loss by this (fp16 loss scaling; 1 otherwise).
  float loss_scale = 1.0f;
  // Written by the last unit's forward: the mean loss over this rank's micro-batch, and how many of
  // its predictions were right out of how many (the task's accuracy metric).
  float loss = 0.0f;
  int64_t correct = 0;
  int64_t predictions = 0;
  // In training, a slot of sizeof(kernels::LossSums) bytes on `device` for this micro-batch (empty in evaluation):
  // a loss kernel may leave its sums there (kernels::crossentropy_forward_backward_into) rather than read them
  // back, which would wait for the device; the unit then sets `predictions` and `loss_sums_written`, and the
  // engine reads every micro-batch's slot once per step for `loss` and `correct`.
  Tensor loss_sums;
  bool loss_sums_written = false;
  // Whether the caller reads the last unit's output after its forward (evaluation, a test of the logits). The
  // engine's training pass does not, so there the last unit may write its loss's gradient over its logits (llm.c's
  // fused classifier): one (B, T, classes) buffer instead of two.
  bool output_read = true;
  // False where no backward follows this forward (Engine::evaluate): the last unit computes its loss without the
  // gradient, and so holds no buffer for it.
  bool backward_follows = true;
  // Whether the units' fp32 GEMMs may run on CUDA's tensor cores in TF32 (kernels::Fp32Gemm): the engine's
  // ZeroConfig::tf32.
  bool tf32 = false;
};

class Unit {
 public:
  virtual ~Unit() = default;

  virtual absl::string_view name() const = 0;
  virtual std::vector<ParamSpec> param_specs() const = 0;
  virtual std::vector<TiedParam> tied_params() const { return {}; }

  // Whether this unit takes part in this micro-batch: a conditional unit (LayerDrop, an expert no token
  // was routed to) returns false to sit out. Then neither its forward nor its backward runs, its input
  // passes through as its output, its gradient gains nothing, and stage 3 does not gather it. The first
  // and last units always run. Every rank must decide alike: ranks that do not would issue different
  // gathers, which fail on every rank (naming the ranks under CommOptions::debug_collectives).
  virtual bool runs(const UnitContext& ctx) const {
    (void)ctx;
    return true;
  }

  // x: the previous unit's output (undefined for the first unit, which reads ctx.batch). Returns this
  // unit's output, which stays valid until this unit's backward; the last unit returns its logits (overwritten by
  // their gradient where !ctx.output_read) and sets ctx.loss and ctx.correct, or leaves them in ctx.loss_sums
  // (classifier_loss does both). Saves what backward needs (or recomputes it there). Evaluation calls forward without a
  // backward (Engine::evaluate): the next forward must replace what this one saved.
  virtual absl::StatusOr<Tensor> forward(UnitContext& ctx, const ParamViews& params, const Tensor& x) = 0;

  // dy: d(loss)/d(output) (undefined for the last unit, which starts from its own loss: the mean over
  // the micro-batch). ADDS this unit's parameter gradients into `grads` — never overwrites, so
  // micro-batches accumulate and tied users sum — and returns d(loss)/d(x) (undefined for the first
  // unit). Frees what forward saved.
  virtual absl::StatusOr<Tensor> backward(UnitContext& ctx, const ParamViews& params, const ParamViews& grads,
                                          const Tensor& dy) = 0;

  // Frees what forward saved when no backward follows: Engine::evaluate calls it once the next unit has
  // read this unit's output (after the last unit's output was seen). A unit that keeps the default holds
  // an evaluation's activations until its next forward replaces them.
  virtual void release_saved() {}
};

// A model is its units, in forward order.
class Model {
 public:
  virtual ~Model() = default;
  virtual std::vector<Unit*> units() = 0;
};

}  // namespace zero
