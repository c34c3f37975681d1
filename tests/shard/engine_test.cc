// The engine: stages 0-3 agree bit for bit, match single-rank training, and hold and send what the formulas say.
#include "shard/engine.h"

#include <cmath>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/shard/toy_training.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using testing::ToyConfig;
using testing::ToyModel;

using testing::TrainRun;
using testing::sgd_factory;
using testing::train_local;

// Rank 0's parameters and losses, every rank's memory and last-step volume, and the run's status.
struct Outcome {
  std::vector<float> params;
  std::vector<float> losses;
  std::vector<MemoryStats> memory;
  std::vector<CommVolume> volume;
  int64_t padded_params = 0;
  absl::Status status;
};

Outcome train(const TrainRun& run) {
  testing::LocalOutcome local = train_local(run);
  Outcome out{.status = local.status};
  if (!local.status.ok()) return out;
  out.params = local.ranks[0].params;
  out.losses = local.ranks[0].losses;
  out.padded_params = local.ranks[0].padded_params;
  for (const testing::RankResult& r : local.ranks) {
    out.memory.push_back(r.memory);
    out.volume.push_back(r.last_step);
  }
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class StagesAgree : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(StagesAgree, AllStagesGiveBitIdenticalParameters) {
  const auto [world_size, accumulation] = GetParam();
  TrainRun run{.world_size = world_size};
  run.zero.accumulation_steps = accumulation;
  run.zero.gradient_clipping = 1.0;
  run.zero.weight_decay = 0.01f;
  run.zero.persistence_threshold = 0;
  run.zero.first_bucket_cap_bytes = 200;  // several stage-0 buckets
  run.zero.bucket_cap_bytes = 600;
  std::vector<float> reference;
  for (int stage = 0; stage <= 3; ++stage) {
    run.zero.stage = stage;
    const Outcome out = train(run);
    ASSERT_TRUE(out.status.ok()) << "stage " << stage << ": " << out.status;
    if (stage == 0) {
      reference = out.params;
      ASSERT_FALSE(reference.empty());
      continue;
    }
    EXPECT_TRUE(bitwise_equal(out.params, reference)) << "stage " << stage << " differs from stage 0";
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizesAndAccumulation, StagesAgree,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return absl::StrCat("N", std::get<0>(info.param), "_A", std::get<1>(info.param));
                         });

TEST(Engine, PersistentSmallUnitsGiveTheSameParameters) {
  TrainRun run{.world_size = 3};
  run.zero.stage = 0;
  const Outcome ddp = train(run);
  run.zero.stage = 3;
  run.zero.persistence_threshold = 100;  // the head (7 elements) stays gathered; the rest is sharded
  const Outcome zero3 = train(run);
  ASSERT_TRUE(ddp.status.ok() && zero3.status.ok()) << zero3.status;
  EXPECT_TRUE(bitwise_equal(zero3.params, ddp.params));
}

TEST(Engine, AnyWorldSizeMatchesSingleRankTraining) {
  // The global batch is the same; only how its mean is summed differs (per rank, then across ranks).
  // Each gradient element sums at most 48 products, so its relative rounding error is below
  // 48 * 2^-24 ~ 3e-6; three SGD steps of lr 0.05 move parameters by a small fraction of their size,
  // so parameters agree to well within 1e-5 of their magnitude.
  TrainRun run{.steps = 3, .optimizer = sgd_factory()};
  run.zero.stage = 3;
  run.zero.persistence_threshold = 0;
  const Outcome single = train(run);
  ASSERT_TRUE(single.status.ok()) << single.status;
  for (int n : {2, 3, 4, 8}) {
    run.world_size = n;
    const Outcome many = train(run);
    ASSERT_TRUE(many.status.ok()) << many.status;
    ASSERT_EQ(many.params.size(), single.params.size());
    for (size_t i = 0; i < single.params.size(); ++i) {
      EXPECT_NEAR(many.params[i], single.params[i], 1e-5f * std::max(1.0f, std::fabs(single.params[i])))
          << "N=" << n << " element " << i;
    }
  }
}

TEST(Engine, LossFallsOnTheToyTask) {
  TrainRun run{.world_size = 2, .steps = 30, .lr = 0.02f};
  run.zero.stage = 3;
  const Outcome out = train(run);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_LT(out.losses.back(), 0.8f * out.losses.front());
}

// --- Accounting: measured peaks and bytes against the formulas in DESIGN.md ---

struct Formula {
  int64_t params, grads, optimizer_state;
};

// fp32 + Adam bytes per rank for Ψp padded parameters (Ψ unpadded: stage 0's optimizer covers
// parameters only).
Formula model_state_bytes(int stage, int64_t padded, int64_t unpadded, int n) {
  switch (stage) {
    case 0: return {4 * padded, 4 * padded, 8 * unpadded};
    case 1: return {4 * padded, 4 * padded, 8 * padded / n};
    case 2: return {4 * padded, 4 * padded / n, 8 * padded / n};
    default: return {4 * padded / n, 4 * padded / n, 8 * padded / n};
  }
}

TEST(EngineAccounting, PeakModelStateMatchesTheFormulasExactly) {
  const ToyConfig big{.features = 31, .hidden = 97, .hidden_layers = 3};
  for (int stage = 0; stage <= 3; ++stage) {
    TrainRun run{.model = big, .world_size = 4, .steps = 2};
    run.zero.stage = stage;
    run.zero.persistence_threshold = 0;
    const Outcome out = train(run);
    ASSERT_TRUE(out.status.ok()) << out.status;
    ToyModel model(big);
    int64_t unpadded = 0;
    for (Unit* u : model.units()) {
      for (const ParamSpec& p : u->param_specs()) unpadded += shape_numel(p.shape);
    }
    const Formula f = model_state_bytes(stage, out.padded_params, unpadded, 4);
    for (int r = 0; r < 4; ++r) {
      const MemoryStats& m = out.memory[r];
      EXPECT_EQ(m.peak_of(MemoryCategory::kParams), f.params) << "stage " << stage << " rank " << r;
      EXPECT_EQ(m.peak_of(MemoryCategory::kGrads), f.grads) << "stage " << stage << " rank " << r;
      EXPECT_EQ(m.peak_of(MemoryCategory::kOptimizerState), f.optimizer_state) << "stage " << stage << " rank " << r;
      EXPECT_EQ(m.peak_of(MemoryCategory::kMasterWeights), 0);
    }
  }
}

TEST(EngineAccounting, BytesSentPerStepMatchTheFormulasExactly) {
  // Untied head: the formulas count each parameter once. Stages 0-2 send 2Ψ(N-1)/N elements per step,
  // stage 3 sends 3Ψ(N-1)/N (gather for forward, gather for backward, reduce-scatter).
  const ToyConfig untied{.features = 31, .hidden = 97, .hidden_layers = 3, .tied_head = false};
  const int n = 4;
  for (int stage = 0; stage <= 3; ++stage) {
    TrainRun run{.model = untied, .world_size = n, .steps = 2};
    run.zero.stage = stage;
    run.zero.persistence_threshold = 0;
    const Outcome out = train(run);
    ASSERT_TRUE(out.status.ok()) << out.status;
    const int64_t psi_bytes = 4 * out.padded_params;
    for (int r = 0; r < n; ++r) {
      const CommVolume& v = out.volume[r];
      const int64_t big = v.param_gather + v.grad_reduce;
      EXPECT_EQ(big, (stage == 3 ? 3 : 2) * psi_bytes * (n - 1) / n) << "stage " << stage;
      EXPECT_EQ(v.grad_reduce, (stage == 0 ? 2 : 1) * psi_bytes * (n - 1) / n) << "stage " << stage;
      EXPECT_EQ(v.small, 2 * 12 * (n - 1) / n) << "the loss/metrics allreduce: 3 fp32";
    }
  }
}

TEST(EngineAccounting, ModelThatDoesNotFitAtStage0TrainsAtStage3) {
  // Many units, as in a real model: stage 3 holds 1/N of the model state plus a few gathered units.
  const ToyConfig big{.features = 31, .hidden = 301, .hidden_layers = 10};
  TrainRun run{.model = big, .world_size = 4, .steps = 2};
  run.zero.stage = 0;
  const Outcome ddp = train(run);
  ASSERT_TRUE(ddp.status.ok()) << ddp.status;
  run.budget = static_cast<int64_t>(0.4 * static_cast<double>(ddp.memory[0].peak_total));
  const Outcome refused = train(run);
  EXPECT_TRUE(is_out_of_memory(refused.status)) << refused.status;
  EXPECT_THAT(std::string(refused.status.message()), HasSubstr("Raise the budget or use a higher ZeRO stage"));
  run.zero.stage = 3;
  run.zero.persistence_threshold = 0;
  const Outcome sharded = train(run);
  ASSERT_TRUE(sharded.status.ok()) << sharded.status;
  EXPECT_LE(sharded.memory[0].peak_total, *run.budget);
}

TEST(EngineConfig, BadValuesNameTheKey) {
  ZeroConfig c;
  c.stage = 4;
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("zero_optimization.stage = 4"));
  c = ZeroConfig{};
  c.accumulation_steps = 0;
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("accumulation_steps = 0"));
  c = ZeroConfig{};
  c.bucket_cap_bytes = 0;
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("bucket_cap_bytes = 0"));
}

}  // namespace
}  // namespace zero
