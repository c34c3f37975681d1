// The wrap policy: which model units the engine flattens together (FSDP's size-based auto-wrap).
#pragma once

// Each flat unit is gathered, reduced and updated as one piece, so a model of many tiny units (biases,
// LayerNorms, small heads) pays a collective per tiny unit. Wrapping merges runs of consecutive units
// until a group holds at least `min_params` elements:
//
//   units     embedding (40k) | h.0 (3k) | h.1 (3k) | h.2 (3k) | head (1k)        min_params = 5000
//   wrapped   embedding       | h.0..h.1 (6k)       | h.2..head (4k: the last group may be smaller)
//
// A group's parameters are its members' named "<member>/<param>" in member order; a tie between two
// members stays inside the group, and a tie to a unit in another group names that group. Forward runs
// the members in order, backward in reverse, each with its own views, so a model cannot tell.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shard/module.h"

namespace zero {

class UnitGroup;

class WrappedModel final : public Model {
 public:
  // min_params 0 keeps every unit on its own. Fails if a unit or parameter name contains '/', or a
  // tie names a unit that does not come earlier.
  static absl::StatusOr<std::unique_ptr<WrappedModel>> wrap(Model& model, int64_t min_params);
  ~WrappedModel() override;

  // Single units as the model's own, groups as UnitGroups.
  std::vector<Unit*> units() override { return units_; }

 private:
  WrappedModel() = default;

  std::vector<std::unique_ptr<UnitGroup>> groups_;
  std::vector<Unit*> units_;
};

// The model's (unit, parameter) for a flat unit's parameter: a group's "h.3/ln_1.weight" is
// ("h.3", "ln_1.weight"); a single unit's names are returned as they are.
std::pair<absl::string_view, absl::string_view> model_param_name(absl::string_view unit, absl::string_view param);

}  // namespace zero
