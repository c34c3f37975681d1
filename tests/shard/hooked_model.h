// A model whose units call test hooks around the wrapped model's own forward and backward.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "shard/module.h"

namespace zero::testing {

struct UnitHooks {
  // Before a unit's forward or backward runs, with "forward <unit>" or "backward <unit>".
  std::function<void(const std::string& event)> on_start;
  // After a unit's backward added its gradients into `grads`.
  std::function<void(const UnitContext& ctx, absl::string_view unit, const ParamViews& grads)> after_backward;
};

class HookedModel final : public Model {
 public:
  HookedModel(Model& inner, UnitHooks hooks);
  ~HookedModel() override;
  std::vector<Unit*> units() override;

 private:
  UnitHooks hooks_;
  std::vector<std::unique_ptr<Unit>> units_;
};

}  // namespace zero::testing
