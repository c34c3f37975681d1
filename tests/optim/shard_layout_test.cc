#include "optim/shard_layout.h"

#include "gtest/gtest.h"

namespace zero {
namespace {

TEST(ShardLayout, ChunksCoverTheShardPartOfEachParameterOnly) {
  // Flat: a [0, 5), gap [5, 6), b [6, 10). Shard [3, 8).
  absl::StatusOr<ShardLayout> l = ShardLayout::create({{"a", 0, 5}, {"b", 6, 4}}, {ParamGroup{}}, 3, 8);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->chunks().size(), 2u);
  EXPECT_EQ(l->chunks()[0].begin, 0);
  EXPECT_EQ(l->chunks()[0].end, 2);
  EXPECT_EQ(l->chunks()[0].param, 0);
  EXPECT_EQ(l->chunks()[1].begin, 3);
  EXPECT_EQ(l->chunks()[1].end, 5);
  EXPECT_EQ(l->chunks()[1].param, 1);
}

TEST(ShardLayout, LongParametersAreSplitIntoBoundedChunks) {
  absl::StatusOr<ShardLayout> l =
      ShardLayout::create({{"w", 0, 2 * kMaxChunkElements + 1}}, {ParamGroup{}}, 0, 2 * kMaxChunkElements + 1);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->chunks().size(), 3u);
  EXPECT_EQ(l->chunks()[2].end - l->chunks()[2].begin, 1);
}

TEST(ShardLayout, ForRankPadsToAMultipleOfTheWorldSize) {
  absl::StatusOr<ShardLayout> l = ShardLayout::for_rank({{"w", 0, 10}}, {ParamGroup{}}, 10, 2, 3);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->shard_begin(), 8);
  EXPECT_EQ(l->shard_end(), 12);
  ASSERT_EQ(l->chunks().size(), 1u);
  EXPECT_EQ(l->chunks()[0].end, 2);  // elements 10 and 11 are padding
}

TEST(ShardLayout, RejectsOverlappingParameters) {
  absl::Status s = ShardLayout::create({{"a", 0, 5}, {"b", 4, 2}}, {ParamGroup{}}, 0, 6).status();
  EXPECT_NE(s.message().find("overlap"), absl::string_view::npos) << s;
}

TEST(ShardLayout, RejectsGroupOutOfRange) {
  EXPECT_FALSE(ShardLayout::create({{"a", 0, 5, 1}}, {ParamGroup{}}, 0, 5).ok());
}

TEST(ShardLayout, RejectsParameterPastTheFlatBuffer) {
  EXPECT_FALSE(ShardLayout::for_rank({{"a", 0, 5}}, {ParamGroup{}}, 4, 0, 1).ok());
}

TEST(DecayGroups, BiasesAndLayerNormGetNoWeightDecayByDefault) {
  std::vector<FlatParam> params = {{"h.0.attn.c_attn.weight"},   {"h.0.attn.c_attn.bias"},
                                   {"h.0.ln_1.weight"},          {"ln_f.bias"},
                                   {"encoder.LayerNorm.weight"}, {"wte"}};
  std::vector<ParamGroup> groups = assign_decay_groups(params, 0.1f);
  EXPECT_EQ(groups[0].weight_decay, 0.1f);
  EXPECT_EQ(groups[1].weight_decay, 0.0f);
  std::vector<int> got;
  for (const FlatParam& p : params) got.push_back(p.group);
  EXPECT_EQ(got, (std::vector<int>{0, 1, 1, 1, 1, 0}));
}

TEST(DecayGroups, PatternsAreConfigurable) {
  std::vector<FlatParam> params = {{"wte"}, {"fc.bias"}};
  assign_decay_groups(params, 0.1f, {"wte"});
  EXPECT_EQ(params[0].group, 1);
  EXPECT_EQ(params[1].group, 0);
}

}  // namespace
}  // namespace zero
