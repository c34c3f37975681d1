// Runs a model's units on one rank without the engine: parameters and gradients (fp32, bf16 or fp16) it can read back.
#pragma once

// What the engine does at stage 0 on one rank, minus the reductions and the optimizer: every unit's
// parameters and gradients in vectors of the engine's dtype, tied parameters viewing their owner's,
// forward in unit order, then backward in reverse. Gradients ADD across calls, as the contract says.
// On a CUDA device the vectors stay on the host: each forward_backward copies the parameters, gradients
// and batch to the device, runs the units there (UnitContext::device) and copies the gradients back.

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
  std::vector<float> logits;  // the last unit's output, copied to the host before its backward
  Shape logits_shape;
};

using ParamFill = std::function<absl::Status(absl::string_view unit, absl::string_view param, const Tensor& dst)>;

class ModelRunner {
 public:
  // Parameters start at zero; init() or load() sets them. `dtype` (fp32, bf16 or fp16) is what the
  // units' parameter and gradient views hold, as under an engine of that precision; `device` is where the
  // units run.
  explicit ModelRunner(Model& model, DType dtype = DType::kF32, Device device = Device::cpu());

  // Every parameter from its ParamSpec's init, the values the engine starts from with this seed. Under
  // bf16/fp16, init() and load() produce fp32 values (fill writes an fp32 tensor) rounded once to dtype.
  void init(uint64_t seed);
  absl::Status load(const ParamFill& fill);
  // `batch` on the host; on a CUDA device, the copies of the parameters, gradients (kParams, kGrads) and
  // batch (kWorkspace) come from `allocator` too, and live for the call.
  absl::StatusOr<RunResult> forward_backward(Allocator& allocator, const Batch& batch, float loss_scale = 1.0f);
  // Called after each unit's backward with its name (none by default). On a CUDA device the host gradients
  // are those from before the call until it returns.
  void set_after_backward(std::function<void(const std::string& unit)> hook) { after_backward_ = std::move(hook); }
  // false: runs as the engine trains, not reading the last unit's output (UnitContext::output_read), so
  // RunResult::logits stays empty and the last unit may write the loss's gradient over them. True by default.
  void set_reads_logits(bool reads) { reads_logits_ = reads; }

  // The parameter or gradient `param` of `unit` (its owner's for a tied one), in dtype; an unknown name aborts.
  Tensor param(absl::string_view unit, absl::string_view param);
  Tensor grad(absl::string_view unit, absl::string_view param);
  // Every gradient, flat, widened to fp32, in unit and declaration order (tied ones once, at their owner).
  std::vector<float> all_grads() const;
  // Calls visit(unit, param) for every parameter a unit owns, in that order.
  void for_each_param(const std::function<void(const std::string& unit, const std::string& param)>& visit) const;

 private:
  struct UnitStorage {
    Unit* unit = nullptr;
    std::string name;
    std::vector<ParamSpec> specs;
    std::vector<std::vector<float>> params, grads;               // per spec; the views' storage under fp32
    std::vector<std::vector<uint16_t>> half_params, half_grads;  // per spec; the views' storage under bf16/fp16
    ParamViews param_views, grad_views;                          // own and tied
  };
  // Every unit's parameter and gradient views, in unit order.
  struct Views {
    std::vector<ParamViews> params, grads;
  };
  UnitStorage& storage(absl::string_view unit);
  // The units' forward in order, then their backward in reverse, on `views` and `batch` on device_.
  absl::StatusOr<RunResult> run_units(Allocator& allocator, const Batch& batch, float loss_scale, const Views& views);
  // forward_backward on a CUDA device_: run_units on copies, then the gradients copied back.
  absl::StatusOr<RunResult> run_on_device(Allocator& allocator, const Batch& batch, float loss_scale);

  DType dtype_;
  Device device_;
  std::vector<UnitStorage> units_;
  std::function<void(const std::string& unit)> after_backward_;
  bool reads_logits_ = true;
};

}  // namespace zero::testing
