#include "shard/wrap.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero {
namespace {

int64_t numel_of(const Unit& unit) {
  int64_t n = 0;
  for (const ParamSpec& spec : unit.param_specs()) n += shape_numel(spec.shape);
  return n;
}

absl::Status check_name(absl::string_view what, absl::string_view name) {
  if (!absl::StrContains(name, '/')) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", name, "' contains '/', which wrapping uses to name a group's parameters; rename it"));
}

}  // namespace

// Consecutive units run as one unit: forward in order, backward in reverse, each member seeing its own
// parameter names. A member that sits a micro-batch out (Unit::runs) is passed over in both; the group
// sits out when all of them do.
class UnitGroup final : public Unit {
 public:
  struct Member {
    Unit* unit;
    std::vector<std::pair<std::string, std::string>> names;  // the member's view name -> the group's
  };

  UnitGroup(std::string name, std::vector<Member> members, std::vector<ParamSpec> specs, std::vector<TiedParam> ties)
      : name_(std::move(name)), members_(std::move(members)), specs_(std::move(specs)), ties_(std::move(ties)) {}

  absl::string_view name() const override { return name_; }
  std::vector<ParamSpec> param_specs() const override { return specs_; }
  std::vector<TiedParam> tied_params() const override { return ties_; }

  bool runs(const UnitContext& ctx) const override {
    for (const Member& m : members_) {
      if (m.unit->runs(ctx)) return true;
    }
    return false;
  }

  absl::StatusOr<Tensor> forward(UnitContext& ctx, const ParamViews& params, const Tensor& x) override {
    Tensor y = x;
    for (const Member& m : members_) {
      if (m.unit->runs(ctx)) {
        ZERO_ASSIGN_OR_RETURN(y, m.unit->forward(ctx, views_of(m, params), y));
      }
    }
    return y;
  }

  void release_saved() override {
    for (const Member& m : members_) m.unit->release_saved();
  }

  absl::StatusOr<Tensor> backward(UnitContext& ctx, const ParamViews& params, const ParamViews& grads,
                                  const Tensor& dy) override {
    Tensor dx = dy;
    for (auto m = members_.rbegin(); m != members_.rend(); ++m) {
      if (m->unit->runs(ctx)) {
        ZERO_ASSIGN_OR_RETURN(dx, m->unit->backward(ctx, views_of(*m, params), views_of(*m, grads), dx));
      }
    }
    return dx;
  }

 private:
  static ParamViews views_of(const Member& m, const ParamViews& group) {
    ParamViews views;
    for (const auto& [own, grouped] : m.names) views.set(own, group.at(grouped));
    return views;
  }

  const std::string name_;
  const std::vector<Member> members_;
  const std::vector<ParamSpec> specs_;
  const std::vector<TiedParam> ties_;
};

WrappedModel::~WrappedModel() = default;

absl::StatusOr<std::unique_ptr<WrappedModel>> WrappedModel::wrap(Model& model, int64_t min_params) {
  const std::vector<Unit*> units = model.units();
  // run_of[i]: the group unit i joins; a group closes once it holds min_params elements.
  std::vector<size_t> run_of(units.size());
  std::vector<std::vector<size_t>> runs;
  int64_t held = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    ZERO_RETURN_IF_ERROR(check_name("unit", units[i]->name()));
    for (const ParamSpec& spec : units[i]->param_specs()) ZERO_RETURN_IF_ERROR(check_name("parameter", spec.name));
    if (runs.empty() || held >= min_params) {
      runs.emplace_back();
      held = 0;
    }
    runs.back().push_back(i);
    run_of[i] = runs.size() - 1;
    held += numel_of(*units[i]);
  }
  const auto run_name = [&](size_t r) {
    const std::vector<size_t>& run = runs[r];
    return run.size() == 1 ? std::string(units[run[0]]->name())
                           : absl::StrCat(units[run.front()]->name(), "..", units[run.back()]->name());
  };
  // The name unit i's parameter has in its flat unit.
  const auto flat_name = [&](size_t i, absl::string_view param) {
    return runs[run_of[i]].size() == 1 ? std::string(param) : absl::StrCat(units[i]->name(), "/", param);
  };

  std::unique_ptr<WrappedModel> wrapped(new WrappedModel());
  for (size_t r = 0; r < runs.size(); ++r) {
    std::vector<UnitGroup::Member> members;
    std::vector<ParamSpec> specs;
    std::vector<TiedParam> ties;
    bool renames = runs[r].size() > 1;
    for (size_t i : runs[r]) {
      UnitGroup::Member member{.unit = units[i]};
      for (ParamSpec spec : units[i]->param_specs()) {
        member.names.emplace_back(spec.name, flat_name(i, spec.name));
        spec.name = flat_name(i, spec.name);
        specs.push_back(std::move(spec));
      }
      for (const TiedParam& tie : units[i]->tied_params()) {
        size_t owner = 0;
        while (owner < i && units[owner]->name() != tie.owner_unit) ++owner;
        if (owner == i) {
          return absl::InvalidArgumentError(absl::StrCat("unit '", units[i]->name(), "' ties to '", tie.owner_unit, ".",
                                                         tie.param, "', which no earlier unit declares"));
        }
        const std::string grouped = flat_name(owner, tie.param);
        member.names.emplace_back(tie.param, grouped);
        renames = renames || grouped != tie.param || run_name(run_of[owner]) != tie.owner_unit;
        const TiedParam outside{.owner_unit = run_name(run_of[owner]), .param = grouped};
        const bool listed = std::any_of(ties.begin(), ties.end(), [&](const TiedParam& t) {
          return t.owner_unit == outside.owner_unit && t.param == outside.param;
        });
        if (run_of[owner] != r && !listed) ties.push_back(outside);
      }
      members.push_back(std::move(member));
    }
    if (!renames) {
      wrapped->units_.push_back(units[runs[r][0]]);
      continue;
    }
    wrapped->groups_.push_back(
        std::make_unique<UnitGroup>(run_name(r), std::move(members), std::move(specs), std::move(ties)));
    wrapped->units_.push_back(wrapped->groups_.back().get());
  }
  return wrapped;
}

std::pair<absl::string_view, absl::string_view> model_param_name(absl::string_view unit, absl::string_view param) {
  const size_t slash = param.find('/');
  if (slash == absl::string_view::npos) return {unit, param};
  return {param.substr(0, slash), param.substr(slash + 1)};
}

}  // namespace zero
