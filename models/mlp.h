// A multi-layer perceptron on the module contract: linear layers with GELU between them and a cross-entropy head.
#pragma once

// widths {D, H1, ..., K}: inputs fp32 (B, D), targets int32 class labels (B) in [0, K), both on ctx.device, where
// every activation and scratch buffer is allocated too.
//   fc0: (B, D) -> (B, H1), GELU;  fc1: (B, H1) -> (B, H2), GELU;  ...;  fc{n-1}: -> logits (B, K), loss
// One unit per layer, named "fc{i}", with parameters "weight" (out, in) as nn.Linear, N(0, 1/in), and
// "bias" (out), zeros. Each computes in its parameters' dtype (fp32, bf16 or fp16, kernels/kernels.h's training
// precision): fc0 rounds the fp32 inputs to it, once, and keeps them for its backward (kActivations). The last unit's
// forward computes the mean cross-entropy, the loss's gradient (saved for backward) and how many argmaxes hit their
// label.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/unit_common.h"
#include "shard/module.h"

namespace zero {

class MlpLayer;

class Mlp final : public Model {
 public:
  // Fails unless there are at least two widths (one layer), all positive.
  static absl::StatusOr<std::unique_ptr<Mlp>> create(std::vector<int64_t> widths);
  ~Mlp() override;

  std::vector<Unit*> units() override;
  const std::vector<int64_t>& widths() const { return widths_; }

 private:
  explicit Mlp(std::vector<int64_t> widths);

  std::vector<int64_t> widths_;
  GradRelay relay_;
  std::vector<std::unique_ptr<MlpLayer>> layers_;
};

}  // namespace zero
