// Runs a model's units on one rank without the engine: fp32 parameters and gradients it can read back.
#pragma once

// What the engine does at stage 0 on one rank, minus the reductions and the optimizer: every unit's
// parameters and gradients in fp32 vectors, tied parameters viewing their owner's, forward in unit
// order, then backward in reverse. Gradients ADD across calls, as the contract says.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/allocator.h"
#include "shard/module.h"

namespace zero::testing {

// What one forward and backward saw.
struct RunResult {
  float loss = 0;
  int64_t correct = 0;
  int64_t predictions = 0;
  std::vector<float> logits;  // the last unit's output, copied before its backward
  Shape logits_shape;
};

using ParamFill = std::function<absl::Status(absl::string_view unit, absl::string_view param, const Tensor& dst)>;

class ModelRunner {
 public:
  // Parameters start at zero; init() or load() sets them.
  explicit ModelRunner(Model& model);

  // Every parameter from its ParamSpec's init, the values the engine starts from with this seed.
  void init(uint64_t seed);
  absl::Status load(const ParamFill& fill);
  absl::StatusOr<RunResult> forward_backward(Allocator& allocator, const Batch& batch, float loss_scale = 1.0f);

  // The parameter or gradient `param` of `unit` (its owner's for a tied one); an unknown name aborts.
  Tensor param(absl::string_view unit, absl::string_view param);
  Tensor grad(absl::string_view unit, absl::string_view param);
  // Every gradient, flat, in unit and declaration order (tied ones once, at their owner).
  std::vector<float> all_grads() const;
  // Calls visit(unit, param) for every parameter a unit owns, in that order.
  void for_each_param(const std::function<void(const std::string& unit, const std::string& param)>& visit) const;

 private:
  struct UnitStorage {
    Unit* unit = nullptr;
    std::string name;
    std::vector<ParamSpec> specs;
    std::vector<std::vector<float>> params, grads;  // per spec
    ParamViews param_views, grad_views;              // own and tied
  };
  UnitStorage& storage(absl::string_view unit);

  std::vector<UnitStorage> units_;
};

}  // namespace zero::testing
