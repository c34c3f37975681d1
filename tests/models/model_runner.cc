#include "tests/models/model_runner.h"

#include <cstring>

#include "runtime/dtype.h"
#include "runtime/status.h"
#include "shard/init.h"

namespace zero::testing {

ModelRunner::ModelRunner(Model& model, DType dtype) : dtype_(dtype) {
  ZERO_CHECK(is_floating(dtype), "ModelRunner holds fp32, bf16 or fp16, not ", dtype_name(dtype));
  const bool half = dtype != DType::kF32;
  for (Unit* unit : model.units()) {
    UnitStorage u{.unit = unit, .name = std::string(unit->name()), .specs = unit->param_specs()};
    for (const ParamSpec& spec : u.specs) {
      // Under bf16/fp16 the fp32 params stay as load()'s and init()'s staging.
      u.params.emplace_back(shape_numel(spec.shape), 0.0f);
      u.grads.emplace_back(half ? 0 : shape_numel(spec.shape), 0.0f);
      u.half_params.emplace_back(half ? shape_numel(spec.shape) : 0, uint16_t{0});  // +0 in both
      u.half_grads.emplace_back(half ? shape_numel(spec.shape) : 0, uint16_t{0});
    }
    units_.push_back(std::move(u));
  }
  // Views only once units_ no longer moves.
  for (UnitStorage& u : units_) {
    for (size_t i = 0; i < u.specs.size(); ++i) {
      void* p = half ? static_cast<void*>(u.half_params[i].data()) : u.params[i].data();
      void* g = half ? static_cast<void*>(u.half_grads[i].data()) : u.grads[i].data();
      u.param_views.set(u.specs[i].name, Tensor(p, dtype, u.specs[i].shape));
      u.grad_views.set(u.specs[i].name, Tensor(g, dtype, u.specs[i].shape));
    }
  }
  for (UnitStorage& u : units_) {
    for (const TiedParam& tied : u.unit->tied_params()) {
      u.param_views.set(tied.param, param(tied.owner_unit, tied.param));
      u.grad_views.set(tied.param, grad(tied.owner_unit, tied.param));
    }
  }
}

void ModelRunner::init(uint64_t seed) {
  for (UnitStorage& u : units_) {
    for (size_t i = 0; i < u.specs.size(); ++i) {
      const int64_t n = static_cast<int64_t>(u.params[i].size());
      init_values(u.specs[i].init, seed, param_key(u.name, u.specs[i].name), 0, n, u.params[i].data());
      for (int64_t j = 0; j < static_cast<int64_t>(u.half_params[i].size()); ++j) {
        store_from_float(u.half_params[i].data(), dtype_, j, u.params[i][j]);
      }
    }
  }
}

absl::Status ModelRunner::load(const ParamFill& fill) {
  for (UnitStorage& u : units_) {
    for (size_t i = 0; i < u.specs.size(); ++i) {
      ZERO_RETURN_IF_ERROR(fill(u.name, u.specs[i].name, Tensor(u.params[i].data(), DType::kF32, u.specs[i].shape)));
      for (int64_t j = 0; j < static_cast<int64_t>(u.half_params[i].size()); ++j) {
        store_from_float(u.half_params[i].data(), dtype_, j, u.params[i][j]);
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RunResult> ModelRunner::forward_backward(Allocator& allocator, const Batch& batch, float loss_scale) {
  UnitContext ctx{.allocator = allocator, .batch = batch, .loss_scale = loss_scale};
  RunResult result;
  Tensor x;
  for (UnitStorage& u : units_) {
    ZERO_ASSIGN_OR_RETURN(x, u.unit->forward(ctx, u.param_views, x));
  }
  result.logits.assign(x.data_as<float>(), x.data_as<float>() + x.numel());
  result.logits_shape = x.shape();
  Tensor dy;
  for (auto u = units_.rbegin(); u != units_.rend(); ++u) {
    ZERO_ASSIGN_OR_RETURN(dy, u->unit->backward(ctx, u->param_views, u->grad_views, dy));
    if (after_backward_) after_backward_(u->name);
  }
  result.loss = ctx.loss;
  result.correct = ctx.correct;
  result.predictions = ctx.predictions;
  return result;
}

ModelRunner::UnitStorage& ModelRunner::storage(absl::string_view unit) {
  for (UnitStorage& u : units_) {
    if (u.name == unit) return u;
  }
  ZERO_CHECK(false, "no unit named ", unit);
  return units_.front();
}

Tensor ModelRunner::param(absl::string_view unit, absl::string_view param) {
  return storage(unit).param_views.at(param);
}

Tensor ModelRunner::grad(absl::string_view unit, absl::string_view param) { return storage(unit).grad_views.at(param); }

std::vector<float> ModelRunner::all_grads() const {
  std::vector<float> out;
  for (const UnitStorage& u : units_) {
    for (const std::vector<float>& g : u.grads) out.insert(out.end(), g.begin(), g.end());
    for (const std::vector<uint16_t>& g : u.half_grads) {
      for (size_t j = 0; j < g.size(); ++j) out.push_back(load_as_float(g.data(), dtype_, j));
    }
  }
  return out;
}

void ModelRunner::for_each_param(const std::function<void(const std::string&, const std::string&)>& visit) const {
  for (const UnitStorage& u : units_) {
    for (const ParamSpec& spec : u.specs) visit(u.name, spec.name);
  }
}

}  // namespace zero::testing
