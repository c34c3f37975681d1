// StagePolicy: what each ZeRO stage partitions, and persistence at stage 3.
#include "shard/stage.h"

#include "gtest/gtest.h"

namespace zero {
namespace {

TEST(StagePolicy, EachStagePartitionsOneMoreOfOptimizerStateGradientsParameters) {
  struct Row {
    bool optimizer_state, gradients, params, updates_everything;
  };
  const Row expected[] = {
      {false, false, false, true}, {true, false, false, false}, {true, true, false, false}, {true, true, true, false}};
  for (int stage = 0; stage < StagePolicy::kStages; ++stage) {
    const StagePolicy policy(stage);
    EXPECT_EQ(policy.stage(), stage);
    EXPECT_EQ(policy.partitions_optimizer_state(), expected[stage].optimizer_state) << "stage " << stage;
    EXPECT_EQ(policy.partitions_gradients(), expected[stage].gradients) << "stage " << stage;
    EXPECT_EQ(policy.partitions_params(), expected[stage].params) << "stage " << stage;
    EXPECT_EQ(policy.updates_everything(), expected[stage].updates_everything) << "stage " << stage;
  }
}

TEST(StagePolicy, OnlyStage3ShardsParamsAndOnlyUnitsAtOrAboveThePersistenceThreshold) {
  for (int stage = 0; stage < 3; ++stage) EXPECT_FALSE(StagePolicy(stage).shards_params(1 << 20, 0));
  const StagePolicy stage3(3);
  EXPECT_TRUE(stage3.shards_params(100, 100));
  EXPECT_FALSE(stage3.shards_params(99, 100));
  EXPECT_TRUE(stage3.shards_params(0, 0));
}

TEST(StagePolicy, ValidStagesAreZeroToThree) {
  EXPECT_FALSE(StagePolicy::valid(-1));
  for (int stage = 0; stage <= 3; ++stage) EXPECT_TRUE(StagePolicy::valid(stage));
  EXPECT_FALSE(StagePolicy::valid(4));
}

}  // namespace
}  // namespace zero
