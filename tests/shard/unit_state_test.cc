// Flat unit states: held and updated ranges per stage, and tied parameters matched to their owners by name.
#include "shard/unit_state.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zero {
namespace {

using ::testing::HasSubstr;

// A unit with one parameter of `numel` elements and the ties it is given; forward and backward are never run.
class DeclaringUnit final : public Unit {
 public:
  DeclaringUnit(std::string name, std::string param, int64_t numel, std::vector<TiedParam> tied = {})
      : name_(std::move(name)), param_(std::move(param)), numel_(numel), tied_(std::move(tied)) {}
  absl::string_view name() const override { return name_; }
  std::vector<ParamSpec> param_specs() const override { return {{.name = param_, .shape = {numel_}}}; }
  // A different order on every call: the engine must not depend on it.
  std::vector<TiedParam> tied_params() const override {
    std::vector<TiedParam> tied = tied_;
    if (++calls_ % 2 == 0) std::reverse(tied.begin(), tied.end());
    return tied;
  }
  absl::StatusOr<Tensor> forward(UnitContext&, const ParamViews&, const Tensor&) override { return Tensor(); }
  absl::StatusOr<Tensor> backward(UnitContext&, const ParamViews&, const ParamViews&, const Tensor&) override {
    return Tensor();
  }

 private:
  std::string name_, param_;
  int64_t numel_;
  std::vector<TiedParam> tied_;
  mutable int calls_ = 0;
};

TEST(UnitState, TiedParametersAreMatchedToTheirOwnersByNameWhateverOrderTheUnitListsThem) {
  DeclaringUnit a("a", "wa", 6), b("b", "wb", 10);
  DeclaringUnit user("user", "own", 4, {{.owner_unit = "a", .param = "wa"}, {.owner_unit = "b", .param = "wb"}});
  const std::vector<Unit*> units = {&a, &b, &user};
  for (int call = 0; call < 2; ++call) {
    const absl::StatusOr<std::vector<UnitState>> states = flat_unit_states(units, StagePolicy(0), 0, 0, 1);
    ASSERT_TRUE(states.ok()) << states.status();
    EXPECT_EQ((*states)[2].needs.size(), 3u);
    std::vector<float> flats[3] = {std::vector<float>(6, 1.0f), std::vector<float>(10, 2.0f),
                                   std::vector<float>(4, 3.0f)};
    const absl::StatusOr<ParamViews> views = unit_views(*states, 2, [&](int owner) -> absl::StatusOr<Tensor> {
      return Tensor(flats[owner].data(), DType::kF32, {static_cast<int64_t>(flats[owner].size())});
    });
    ASSERT_TRUE(views.ok()) << views.status();
    EXPECT_EQ(views->at("wa").numel(), 6);
    EXPECT_EQ(views->at("wa").data_as<float>()[0], 1.0f) << "call " << call;
    EXPECT_EQ(views->at("wb").numel(), 10);
    EXPECT_EQ(views->at("wb").data_as<float>()[0], 2.0f) << "call " << call;
    EXPECT_EQ(views->at("own").data_as<float>()[0], 3.0f);
  }
}

TEST(UnitState, ATieToAUnitThatDoesNotComeEarlierIsRefusedNamingIt) {
  DeclaringUnit user("user", "own", 4, {{.owner_unit = "later", .param = "w"}});
  DeclaringUnit later("later", "w", 4);
  const std::vector<Unit*> units = {&user, &later};
  const absl::StatusOr<std::vector<UnitState>> states = flat_unit_states(units, StagePolicy(0), 0, 0, 1);
  EXPECT_EQ(states.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(states.status().message()), HasSubstr("unit 'user' ties to 'later.w'"));
}

TEST(UnitState, EachStageHoldsAndUpdatesTheRangesItsPolicySays) {
  DeclaringUnit a("a", "w", 10);  // padded to 12 over 3 ranks: slices of 4
  const std::vector<Unit*> units = {&a};
  struct Expected {
    int64_t held_begin, held_numel, own_begin, own_count, grads_numel;
  };
  const int rank = 1;
  const Expected expected[] = {{0, 12, 0, 10, 12}, {0, 12, 4, 4, 12}, {0, 12, 4, 4, 4}, {4, 4, 4, 4, 4}};
  for (int stage = 0; stage < StagePolicy::kStages; ++stage) {
    const absl::StatusOr<std::vector<UnitState>> states = flat_unit_states(units, StagePolicy(stage), 0, rank, 3);
    ASSERT_TRUE(states.ok()) << states.status();
    const UnitState& u = (*states)[0];
    EXPECT_EQ(u.held_begin, expected[stage].held_begin) << "stage " << stage;
    EXPECT_EQ(u.held_numel, expected[stage].held_numel) << "stage " << stage;
    EXPECT_EQ(u.own_begin, expected[stage].own_begin) << "stage " << stage;
    EXPECT_EQ(u.own_count, expected[stage].own_count) << "stage " << stage;
    EXPECT_EQ(u.grads_numel, expected[stage].grads_numel) << "stage " << stage;
  }
  const absl::StatusOr<std::vector<UnitState>> persistent = flat_unit_states(units, StagePolicy(3), 11, rank, 3);
  ASSERT_TRUE(persistent.ok());
  EXPECT_FALSE((*persistent)[0].sharded) << "10 elements are under a persistence threshold of 11";
  EXPECT_EQ((*persistent)[0].held_numel, 12);
}

}  // namespace
}  // namespace zero
