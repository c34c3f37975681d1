#include "tests/shard/hooked_model.h"

#include "absl/strings/str_cat.h"

namespace zero::testing {
namespace {

class HookedUnit final : public Unit {
 public:
  HookedUnit(Unit& inner, const UnitHooks& hooks) : inner_(inner), hooks_(hooks) {}
  absl::string_view name() const override { return inner_.name(); }
  std::vector<ParamSpec> param_specs() const override { return inner_.param_specs(); }
  std::vector<TiedParam> tied_params() const override { return inner_.tied_params(); }
  bool runs(const UnitContext& ctx) const override { return inner_.runs(ctx); }
  absl::StatusOr<Tensor> forward(UnitContext& ctx, const ParamViews& params, const Tensor& x) override {
    if (hooks_.on_start) hooks_.on_start(absl::StrCat("forward ", name()));
    return inner_.forward(ctx, params, x);
  }
  absl::StatusOr<Tensor> backward(UnitContext& ctx, const ParamViews& params, const ParamViews& grads,
                                  const Tensor& dy) override {
    if (hooks_.on_start) hooks_.on_start(absl::StrCat("backward ", name()));
    absl::StatusOr<Tensor> dx = inner_.backward(ctx, params, grads, dy);
    if (dx.ok() && hooks_.after_backward) hooks_.after_backward(ctx, name(), grads);
    return dx;
  }
  void release_saved() override { inner_.release_saved(); }

 private:
  Unit& inner_;
  const UnitHooks& hooks_;
};

}  // namespace

HookedModel::HookedModel(Model& inner, UnitHooks hooks) : hooks_(std::move(hooks)) {
  for (Unit* u : inner.units()) units_.push_back(std::make_unique<HookedUnit>(*u, hooks_));
}

HookedModel::~HookedModel() = default;

std::vector<Unit*> HookedModel::units() {
  std::vector<Unit*> units;
  for (auto& u : units_) units.push_back(u.get());
  return units;
}

}  // namespace zero::testing
