// Replays the 20-step trajectories in tests/fixtures/optim_golden.safetensors (make_optim_fixtures.py).
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "optim/optimizers.h"
#include "runtime/safetensors.h"

namespace zero {
namespace {

constexpr int kSteps = 20;
constexpr int64_t kNumel = 96;

using Factory = std::function<absl::StatusOr<std::unique_ptr<Optimizer>>(ShardLayout, Allocator&)>;

struct GoldenCase {
  std::string name;
  float lr;
  float weight_decay;
  Factory make;
};

// The layout make_optim_fixtures.py uses: weights in group 0, biases and LayerNorm in group 1 at half the lr.
ShardLayout fixture_layout(float weight_decay) {
  std::vector<FlatParam> params = {
      {"fc.weight", 0, 42}, {"fc.bias", 42, 7}, {"ln_1.weight", 49, 7}, {"proj.weight", 56, 35}, {"proj.bias", 91, 5}};
  std::vector<ParamGroup> groups = assign_decay_groups(params, weight_decay);
  groups[1].lr_scale = 0.5f;
  return *ShardLayout::create(params, groups, 0, kNumel);
}

class GoldenTrajectory : public ::testing::TestWithParam<GoldenCase> {};

// "Matches to 1e-6 relative in fp32" (the issue), every element of every step, relative to the element's
// magnitude max(|golden|, |initial|): PyTorch's CPU kernels fuse multiply-adds (Vectorized fmadd in add
// with alpha) where zero rounds twice (no FMA, so every build and the GPU give the same bits), and an
// element that passes near zero by cancellation cannot keep that difference small relative to itself.
// LAMB/LARS differ from their Python reference in a few roundings (the moments' lerp form; exact norms
// here, fp64 there).
TEST_P(GoldenTrajectory, MatchesFixtureToOneMillionthRelative) {
  const GoldenCase& c = GetParam();
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(ZERO_FIXTURES_DIR "/optim_golden.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<Tensor> params0 = file->get(c.name + ".params0", DType::kF32, {kNumel});
  absl::StatusOr<Tensor> grads = file->get(c.name + ".grads", DType::kF32, {kSteps, kNumel});
  absl::StatusOr<Tensor> golden = file->get(c.name + ".params", DType::kF32, {kSteps, kNumel});
  ASSERT_TRUE(params0.ok() && grads.ok() && golden.ok());

  Allocator allocator;
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = c.make(fixture_layout(c.weight_decay), allocator);
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> params(params0->data_as<float>(), params0->data_as<float>() + kNumel);
  for (int t = 1; t <= kSteps; ++t) {
    Tensor g = grads->view((t - 1) * kNumel, {kNumel});
    ASSERT_TRUE((*opt)->step(Tensor(params.data(), DType::kF32, {kNumel}), g, t, c.lr).ok());
    const float* want = golden->data_as<float>() + (t - 1) * kNumel;
    for (int64_t i = 0; i < kNumel; ++i) {
      const float magnitude = std::max(std::fabs(want[i]), std::fabs(params0->data_as<float>()[i]));
      ASSERT_LE(std::fabs(params[i] - want[i]), 1e-6f * magnitude)
          << c.name << " step " << t << " element " << i << ": " << params[i] << " vs " << want[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, GoldenTrajectory,
    ::testing::Values(GoldenCase{"sgd", 0.0625f, 1.0f / 64,
                                 [](ShardLayout l, Allocator& a) {
                                   return make_sgd({.momentum = 0.9}, std::move(l), a);
                                 }},
                      GoldenCase{"sgd_plain", 0.0625f, 0.0f,
                                 [](ShardLayout l, Allocator& a) { return make_sgd({}, std::move(l), a); }},
                      GoldenCase{"sgd_dampened", 0.0625f, 1.0f / 64,
                                 [](ShardLayout l, Allocator& a) {
                                   return make_sgd({.momentum = 0.5, .dampening = 0.25}, std::move(l), a);
                                 }},
                      GoldenCase{"sgd_nesterov", 0.0625f, 1.0f / 64,
                                 [](ShardLayout l, Allocator& a) {
                                   return make_sgd({.momentum = 0.9, .nesterov = true}, std::move(l), a);
                                 }},
                      GoldenCase{"adam", 0.0078125f, 1.0f / 64,
                                 [](ShardLayout l, Allocator& a) {
                                   return make_adam({.decoupled_weight_decay = false}, std::move(l), a);
                                 }},
                      GoldenCase{"adamw", 0.0078125f, 0.125f,
                                 [](ShardLayout l, Allocator& a) { return make_adam({}, std::move(l), a); }},
                      GoldenCase{"lamb", 0.0078125f, 1.0f / 64,
                                 [](ShardLayout l, Allocator& a) { return make_lamb({}, std::move(l), a); }},
                      GoldenCase{"lars", 0.125f, 1.0f / 64,
                                 [](ShardLayout l, Allocator& a) {
                                   return make_lars({.momentum = 0.9, .trust_coefficient = 0.02}, std::move(l), a);
                                 }}),
    [](const ::testing::TestParamInfo<GoldenCase>& info) { return info.param.name; });

}  // namespace
}  // namespace zero
