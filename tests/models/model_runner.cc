// ModelRunner: one rank's stage-0 forward and backward over host-held parameters, on the CPU or a CUDA device.
#include "tests/models/model_runner.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "models/unit_common.h"
#include "runtime/device_memory.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "shard/init.h"

namespace zero::testing {
namespace {

// The elements of a floating tensor, copied to the host and widened exactly to fp32.
absl::StatusOr<std::vector<float>> host_floats(const Tensor& t) {
  std::vector<char> bytes(t.nbytes());
  ZERO_RETURN_IF_ERROR(copy_bytes(bytes.data(), Device::cpu(), t.data(), t.device(), t.nbytes()));
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = load_as_float(bytes.data(), t.dtype(), i);
  return out;
}

// A unit's parameter names, its own then its tied ones.
std::vector<std::string> view_names(const Unit& unit) {
  std::vector<std::string> names;
  for (const ParamSpec& spec : unit.param_specs()) names.push_back(spec.name);
  for (const TiedParam& t : unit.tied_params()) names.push_back(t.param);
  return names;
}

// Copies of host tensors on a device, each made once however often it is asked for (a tied view shares its
// owner's copy); they live as long as the mirror.
class DeviceMirror {
 public:
  DeviceMirror(Allocator& allocator, Device device) : allocator_(allocator), device_(device) {}

  // The copy of `host` (Tensor() for Tensor()), in a new `category` buffer the first time.
  absl::StatusOr<Tensor> copy_of(const Tensor& host, MemoryCategory category) {
    if (host.data() == nullptr) return host;
    if (auto it = copies_.find(host.data()); it != copies_.end()) return it->second.device;
    ZERO_ASSIGN_OR_RETURN(Buffer buffer, allocator_.allocate(static_cast<int64_t>(host.nbytes()), category, device_));
    const Tensor copy = buffer.tensor(host.dtype(), host.shape());
    ZERO_RETURN_IF_ERROR(copy_bytes(copy.data(), device_, host.data(), Device::cpu(), host.nbytes()));
    buffers_.push_back(std::move(buffer));
    copies_.emplace(host.data(), Copy{host, copy, category});
    return copy;
  }

  // The copies of `names` from `host`, under the same names.
  absl::StatusOr<ParamViews> copy_views(const ParamViews& host, const std::vector<std::string>& names,
                                        MemoryCategory category) {
    ParamViews out;
    for (const std::string& name : names) {
      ZERO_ASSIGN_OR_RETURN(Tensor copy, copy_of(host.at(name), category));
      out.set(name, copy);
    }
    return out;
  }

  // Every copy of `category` written back over the host tensor it was made from.
  absl::Status copy_back(MemoryCategory category) const {
    for (const auto& [data, c] : copies_) {
      if (c.category == category)
        ZERO_RETURN_IF_ERROR(
            copy_bytes(c.host.data(), Device::cpu(), c.device.data(), c.device.device(), c.host.nbytes()));
    }
    return absl::OkStatus();
  }

 private:
  struct Copy {
    Tensor host, device;
    MemoryCategory category;
  };
  Allocator& allocator_;
  const Device device_;
  std::vector<Buffer> buffers_;
  absl::flat_hash_map<const void*, Copy> copies_;  // by the host tensor's data
};

}  // namespace

ModelRunner::ModelRunner(Model& model, DType dtype, Device device) : dtype_(dtype), device_(device) {
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
  if (device_.is_cuda()) return run_on_device(allocator, batch, loss_scale);
  Views views;
  for (const UnitStorage& u : units_) {
    views.params.push_back(u.param_views);
    views.grads.push_back(u.grad_views);
  }
  return run_units(allocator, batch, loss_scale, views);
}

absl::StatusOr<RunResult> ModelRunner::run_on_device(Allocator& allocator, const Batch& batch, float loss_scale) {
  DeviceMirror mirror(allocator, device_);
  Views views;
  for (const UnitStorage& u : units_) {
    const std::vector<std::string> names = view_names(*u.unit);
    ZERO_ASSIGN_OR_RETURN(ParamViews params, mirror.copy_views(u.param_views, names, MemoryCategory::kParams));
    ZERO_ASSIGN_OR_RETURN(ParamViews grads, mirror.copy_views(u.grad_views, names, MemoryCategory::kGrads));
    views.params.push_back(std::move(params));
    views.grads.push_back(std::move(grads));
  }
  Batch on_device;
  ZERO_ASSIGN_OR_RETURN(on_device.inputs, mirror.copy_of(batch.inputs, MemoryCategory::kWorkspace));
  ZERO_ASSIGN_OR_RETURN(on_device.targets, mirror.copy_of(batch.targets, MemoryCategory::kWorkspace));
  ZERO_ASSIGN_OR_RETURN(RunResult result, run_units(allocator, on_device, loss_scale, views));
  ZERO_RETURN_IF_ERROR(mirror.copy_back(MemoryCategory::kGrads));
  return result;
}

absl::StatusOr<RunResult> ModelRunner::run_units(Allocator& allocator, const Batch& batch, float loss_scale,
                                                 const Views& views) {
  UnitContext ctx{.allocator = allocator,
                  .batch = batch,
                  .device = device_,
                  .loss_scale = loss_scale,
                  .output_read = reads_logits_};
  RunResult result;
  Tensor x;
  for (size_t i = 0; i < units_.size(); ++i) {
    ZERO_ASSIGN_OR_RETURN(x, units_[i].unit->forward(ctx, views.params[i], x));
  }
  if (reads_logits_) {
    ZERO_ASSIGN_OR_RETURN(result.logits, host_floats(x));
  }
  result.logits_shape = x.shape();
  Tensor dy;
  for (size_t i = units_.size(); i-- > 0;) {
    ZERO_ASSIGN_OR_RETURN(dy, units_[i].unit->backward(ctx, views.params[i], views.grads[i], dy));
    if (after_backward_) after_backward_(units_[i].name);
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
