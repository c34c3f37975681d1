// The same optimizer over N shards gives bitwise the parameters (and half copies) of N = 1.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "optim/optimizers.h"
#include "runtime/comm/local.h"
#include "runtime/status.h"

namespace zero {
namespace {

// 401 elements: "block.weight" [37, 338) straddles all three shards when N = 3 (S = 134), and 401 is
// not a multiple of 2, 3, 4 or 8, so every N > 1 pads.
const std::vector<FlatParam> kParams = {
    {"embed.weight", 0, 37}, {"block.weight", 37, 301}, {"block.bias", 338, 13}, {"ln_f.weight", 351, 50}};
constexpr int64_t kFlat = 401;
constexpr int kSteps = 4;

using Factory = std::function<absl::StatusOr<std::unique_ptr<Optimizer>>(ShardLayout, Allocator&)>;

struct Result {
  std::vector<float> params;   // (padded)
  std::vector<uint16_t> half;  // (padded) bf16 copy with stochastic rounding
};

std::vector<float> random_vector(int64_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Runs kSteps steps on N local ranks, each updating its shard of a padded flat buffer. Padding grads are
// NaN: they must never be read, and padding params must stay zero. `measured`: an optimizer that communicates
// steps as an engine drives it, measure() and reduce_norm_parts() first, then step() with the norms.
Result run_sharded(const Factory& make, int world_size, bool measured = false) {
  const int64_t padded = (kFlat + world_size - 1) / world_size * world_size;
  const int64_t shard = padded / world_size;
  Result result{std::vector<float>(padded, 0.0f), std::vector<uint16_t>(padded, 0)};
  std::vector<float> init = random_vector(kFlat, 7, 1.0f);
  std::copy(init.begin(), init.end(), result.params.begin());
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < kSteps; ++t) {
    grads.push_back(random_vector(kFlat, 100 + t, 0.1f));
    grads.back().resize(padded, std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<absl::Status> statuses = run_local_ranks(world_size, [&](Communicator& comm) -> absl::Status {
    std::vector<FlatParam> params = kParams;
    std::vector<ParamGroup> groups = assign_decay_groups(params, 0.01f);
    groups[1].lr_scale = 0.5f;
    ZERO_ASSIGN_OR_RETURN(ShardLayout layout, ShardLayout::for_rank(params, groups, kFlat, comm.rank(), world_size));
    Allocator allocator(comm.rank());
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, make(std::move(layout), allocator));
    const int64_t begin = comm.rank() * shard;
    Tensor p(result.params.data() + begin, DType::kF32, {shard});  // ranks write disjoint slices
    HalfCopy half{Tensor(result.half.data() + begin, DType::kBF16, {shard}), /*stochastic=*/true, /*seed=*/42};
    for (int t = 1; t <= kSteps; ++t) {
      Tensor g(grads[t - 1].data() + begin, DType::kF32, {shard});
      if (!measured || !opt->communicates()) {
        ZERO_RETURN_IF_ERROR(opt->step(p, g, t, 0.05f, &comm, half));
        continue;
      }
      ZERO_ASSIGN_OR_RETURN(NormParts parts, opt->measure(p, g, t, 0.05f));
      ZERO_ASSIGN_OR_RETURN(const std::vector<WholeParamNorms> norms, reduce_norm_parts({parts}, &comm));
      ZERO_RETURN_IF_ERROR(opt->step(p, g, t, 0.05f, &comm, half, &norms[0]));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(root_cause(statuses).ok()) << root_cause(statuses);
  return result;
}

struct ShardedCase {
  std::string name;
  Factory make;
};

class ShardedEqualsUnsharded : public ::testing::TestWithParam<ShardedCase> {};

TEST_P(ShardedEqualsUnsharded, BitwiseForOneToEightShards) {
  const Result reference = run_sharded(GetParam().make, 1);
  for (int n : {2, 3, 4, 8}) {
    const Result sharded = run_sharded(GetParam().make, n);
    EXPECT_EQ(std::memcmp(sharded.params.data(), reference.params.data(), kFlat * sizeof(float)), 0) << "N = " << n;
    EXPECT_EQ(std::memcmp(sharded.half.data(), reference.half.data(), kFlat * sizeof(uint16_t)), 0) << "N = " << n;
    for (int64_t i = kFlat; i < static_cast<int64_t>(sharded.params.size()); ++i) {
      EXPECT_EQ(float_bits(sharded.params[i]), 0u) << "padding element " << i << " with N = " << n;
    }
  }
}

TEST_P(ShardedEqualsUnsharded, MeasuredFirstAsAnEngineDoesIsBitwiseTheSame) {
  const Result reference = run_sharded(GetParam().make, 1);
  for (int n : {1, 3, 8}) {
    const Result measured = run_sharded(GetParam().make, n, /*measured=*/true);
    EXPECT_EQ(std::memcmp(measured.params.data(), reference.params.data(), kFlat * sizeof(float)), 0) << "N = " << n;
    EXPECT_EQ(std::memcmp(measured.half.data(), reference.half.data(), kFlat * sizeof(uint16_t)), 0) << "N = " << n;
  }
}

TEST_P(ShardedEqualsUnsharded, UpdatesEveryParameter) {
  const Result reference = run_sharded(GetParam().make, 1);
  const std::vector<float> init = random_vector(kFlat, 7, 1.0f);
  for (int64_t i = 0; i < kFlat; ++i) EXPECT_NE(reference.params[i], init[i]) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ShardedEqualsUnsharded,
    ::testing::Values(
        ShardedCase{
            "sgd_nesterov",
            [](ShardLayout l, Allocator& a) { return make_sgd({.momentum = 0.9, .nesterov = true}, std::move(l), a); }},
        ShardedCase{"adam", [](ShardLayout l,
                               Allocator& a) { return make_adam({.decoupled_weight_decay = false}, std::move(l), a); }},
        ShardedCase{"adamw", [](ShardLayout l, Allocator& a) { return make_adam({}, std::move(l), a); }},
        ShardedCase{"lamb", [](ShardLayout l, Allocator& a) { return make_lamb({}, std::move(l), a); }},
        ShardedCase{"lars", [](ShardLayout l,
                               Allocator& a) { return make_lars({.trust_coefficient = 0.02}, std::move(l), a); }}),
    [](const ::testing::TestParamInfo<ShardedCase>& info) { return info.param.name; });

TEST(Lamb, ShardWithoutCommunicatorIsRejectedWhenAParameterStraddlesIt) {
  Allocator allocator;
  std::vector<ParamGroup> groups = {ParamGroup{}};
  std::vector<FlatParam> params = {{"w", 0, 10}};
  absl::StatusOr<ShardLayout> layout = ShardLayout::for_rank(params, groups, 10, 0, 2);
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = make_lamb({}, *layout, allocator);
  ASSERT_TRUE(opt.ok());
  std::vector<float> p(5, 1.0f), g(5, 1.0f);
  absl::Status s = (*opt)->step(Tensor(p.data(), DType::kF32, {5}), Tensor(g.data(), DType::kF32, {5}), 1, 0.1f);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST(Optimizer, StateIsAllocatedForTheShardOnlyAsOptimizerState) {
  Allocator allocator;
  std::vector<FlatParam> params = kParams;
  std::vector<ParamGroup> groups = assign_decay_groups(params, 0.0f);
  absl::StatusOr<ShardLayout> layout = ShardLayout::for_rank(params, groups, kFlat, 1, 4);
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = make_adam({}, *layout, allocator);
  ASSERT_TRUE(opt.ok());
  EXPECT_EQ(allocator.stats().current_of(MemoryCategory::kOptimizerState), 2 * 101 * 4);
  ASSERT_EQ((*opt)->state().size(), 2u);
  EXPECT_EQ((*opt)->state()[1].first, "exp_avg_sq");
  EXPECT_EQ((*opt)->state()[1].second.numel(), 101);
}

TEST(Optimizer, StepRejectsAGradientOfTheWrongSize) {
  Allocator allocator;
  absl::StatusOr<ShardLayout> layout = ShardLayout::create({{"w", 0, 4}}, {ParamGroup{}}, 0, 4);
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = make_sgd({}, *layout, allocator);
  ASSERT_TRUE(opt.ok());
  std::vector<float> p(4), g(3);
  absl::Status s = (*opt)->step(Tensor(p.data(), DType::kF32, {4}), Tensor(g.data(), DType::kF32, {3}), 1, 0.1f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("grads"), absl::string_view::npos) << s;
}

TEST(Optimizer, StepRejectsIntegerGradientsAndScalesThatAreNotFiniteAndPositive) {
  Allocator allocator;
  absl::StatusOr<ShardLayout> layout = ShardLayout::create({{"w", 0, 4}}, {ParamGroup{}}, 0, 4);
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = make_sgd({}, *layout, allocator);
  ASSERT_TRUE(opt.ok());
  std::vector<float> p(4), g(4);
  const Tensor params(p.data(), DType::kF32, {4}), grads(g.data(), DType::kF32, {4});
  absl::Status s = (*opt)->step(params, Tensor(g.data(), DType::kI32, {4}), 1, 0.1f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("grads"), absl::string_view::npos) << s;
  for (const auto& [loss_scale, clip] :
       std::vector<std::pair<float, float>>{{0.0f, 1.0f},
                                            {std::nanf(""), 1.0f},
                                            {std::numeric_limits<float>::infinity(), 1.0f},
                                            {1.0f, -0.5f},
                                            {1.0f, std::numeric_limits<float>::infinity()}}) {
    s = (*opt)->step(params, Gradients(grads, loss_scale, clip), 1, 0.1f);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << loss_scale << ", " << clip;
    EXPECT_NE(s.message().find("the loss scale must be finite and > 0, the clip finite and >= 0"),
              absl::string_view::npos)
        << s;
  }
  EXPECT_TRUE((*opt)->step(params, Gradients(grads, 128.0f, 0.5f), 1, 0.1f).ok());
  EXPECT_TRUE((*opt)->step(params, Gradients(grads, 1.0f, 0.0f), 1, 0.1f).ok());  // a norm past a float's range
}

TEST(Optimizer, StepZeroIsRejected) {
  Allocator allocator;
  absl::StatusOr<ShardLayout> layout = ShardLayout::create({{"w", 0, 4}}, {ParamGroup{}}, 0, 4);
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = make_adam({}, *layout, allocator);
  std::vector<float> p(4), g(4);
  EXPECT_FALSE((*opt)->step(Tensor(p.data(), DType::kF32, {4}), Tensor(g.data(), DType::kF32, {4}), 0, 0.1f).ok());
}

TEST(Optimizer, OutOfBudgetStateIsOutOfMemory) {
  Allocator allocator(0, /*budget_bytes=*/100);
  absl::StatusOr<ShardLayout> layout = ShardLayout::create({{"w", 0, 1000}}, {ParamGroup{}}, 0, 1000);
  EXPECT_TRUE(is_out_of_memory(make_adam({}, *layout, allocator).status()));
}

TEST(Sgd, NesterovWithoutMomentumIsRejected) {
  Allocator allocator;
  absl::StatusOr<ShardLayout> layout = ShardLayout::create({}, {ParamGroup{}}, 0, 0);
  EXPECT_EQ(make_sgd({.nesterov = true}, *layout, allocator).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zero
