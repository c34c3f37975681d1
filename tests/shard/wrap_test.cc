// The wrap policy: which units merge, how their parameters and ties are named, and that training cannot tell.
#include "shard/wrap.h"

#include <cstring>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/shard/toy_training.h"

namespace zero {
namespace {

using ::testing::ElementsAre;
using testing::ToyConfig;
using testing::ToyModel;

std::vector<std::string> names_of(const std::vector<Unit*>& units) {
  std::vector<std::string> names;
  for (const Unit* u : units) names.emplace_back(u->name());
  return names;
}

std::vector<std::string> param_names(const Unit& unit) {
  std::vector<std::string> names;
  for (const ParamSpec& spec : unit.param_specs()) names.push_back(spec.name);
  return names;
}

// Default toy sizes, D = 7, H = 13: input 13·7 + 13 = 104, hidden_k 13·13 + 13 = 182, head 7 (tied).
TEST(WrapPolicy, ZeroKeepsEveryUnitAsItIs) {
  ToyModel model(ToyConfig{});
  absl::StatusOr<std::unique_ptr<WrappedModel>> wrapped = WrappedModel::wrap(model, 0);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  EXPECT_EQ((*wrapped)->units(), model.units());
}

TEST(WrapPolicy, MergesConsecutiveUnitsUntilAGroupHoldsMinParams) {
  ToyModel model(ToyConfig{});
  absl::StatusOr<std::unique_ptr<WrappedModel>> wrapped = WrappedModel::wrap(model, 200);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  const std::vector<Unit*> units = (*wrapped)->units();
  // 104 < 200, so hidden_0 joins (286); hidden_1 starts the next group and the head joins it (189).
  EXPECT_THAT(names_of(units), ElementsAre("input..hidden_0", "hidden_1..head"));
  EXPECT_THAT(param_names(*units[0]), ElementsAre("input/weight", "input/bias", "hidden_0/weight", "hidden_0/bias"));
  EXPECT_THAT(param_names(*units[1]), ElementsAre("hidden_1/weight", "hidden_1/bias", "head/bias"));
  const std::vector<TiedParam> ties = units[1]->tied_params();
  ASSERT_EQ(ties.size(), 1u);
  EXPECT_EQ(ties[0].owner_unit, "input..hidden_0");
  EXPECT_EQ(ties[0].param, "input/weight");
}

TEST(WrapPolicy, AUnitLeftAloneStillFollowsItsTiedOwnerIntoItsGroup) {
  ToyModel model(ToyConfig{.hidden_layers = 1});
  absl::StatusOr<std::unique_ptr<WrappedModel>> wrapped = WrappedModel::wrap(model, 200);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  const std::vector<Unit*> units = (*wrapped)->units();
  EXPECT_THAT(names_of(units), ElementsAre("input..hidden_0", "head"));
  EXPECT_NE(units[1], model.units()[2]) << "the head is wrapped to rename its tie";
  EXPECT_THAT(param_names(*units[1]), ElementsAre("bias"));
  const std::vector<TiedParam> ties = units[1]->tied_params();
  ASSERT_EQ(ties.size(), 1u);
  EXPECT_EQ(ties[0].owner_unit, "input..hidden_0");
  EXPECT_EQ(ties[0].param, "input/weight");
}

TEST(WrapPolicy, GroupParameterNamesMapBackToTheModels) {
  EXPECT_EQ(model_param_name("h.0..h.3", "h.2/ln_1.weight"),
            std::make_pair(absl::string_view("h.2"), absl::string_view("ln_1.weight")));
  EXPECT_EQ(model_param_name("head", "bias"), std::make_pair(absl::string_view("head"), absl::string_view("bias")));
}

TEST(WrapPolicy, WrappedTrainingGivesBitIdenticalParametersAtEveryStage) {
  // Each element is reduced in the same rank order and updated by the same elementwise optimizer,
  // whichever flat unit holds it; the clipping norm is exact. Only padding and collective count change.
  testing::TrainRun run;
  run.world_size = 3;
  run.zero.gradient_clipping = 1.0;
  run.zero.persistence_threshold = 0;
  for (int stage = 0; stage <= 3; ++stage) {
    run.zero.stage = stage;
    run.zero.wrap_min_params = 0;
    const testing::LocalOutcome unwrapped = testing::train_local(run);
    run.zero.wrap_min_params = 200;
    const testing::LocalOutcome wrapped = testing::train_local(run);
    ASSERT_TRUE(unwrapped.status.ok() && wrapped.status.ok()) << unwrapped.status << wrapped.status;
    const std::vector<float>& a = unwrapped.ranks[0].params;
    const std::vector<float>& b = wrapped.ranks[0].params;
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "stage " << stage;
    EXPECT_NE(wrapped.ranks[0].padded_params, unwrapped.ranks[0].padded_params) << "the same flat layout";
  }
}

}  // namespace
}  // namespace zero
