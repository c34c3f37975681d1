// The planner's formulas: the ZeRO papers' figures by hand, the largest model a budget holds, and the engine's measured
// bytes.
#include "shard/plan.h"

#include <string>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "runtime/status.h"
#include "tests/shard/toy_training.h"
#include "tests/temp_dir.h"

namespace zero {
namespace {

using ::testing::HasSubstr;

int64_t total(PlanInput input, int stage) {
  input.stage = stage;
  return model_state_bytes(input).total();
}

TEST(Plan, ZeroPaperSevenAndAHalfBillionOnSixtyFourRanks) {
  // ZeRO (Rajbhandari et al.), Figure 1: Ψ = 7.5e9, N = 64, mixed precision with Adam (2 + 2 + 12 bytes).
  // Ψ/64 = 117,187,500 exactly, so there is no padding.
  const PlanInput input{.params = 7'500'000'000, .world_size = 64, .precision = DType::kBF16};
  EXPECT_EQ(total(input, 0), 120'000'000'000);  // 16Ψ
  EXPECT_EQ(total(input, 1), 31'406'250'000);   // 4Ψ + 12Ψ/64 = 30e9 + 1.40625e9
  EXPECT_EQ(total(input, 2), 16'640'625'000);   // 2Ψ + 14Ψ/64 = 15e9 + 1.640625e9
  EXPECT_EQ(total(input, 3), 1'875'000'000);    // 16Ψ/64
}

TEST(Plan, CategoriesOfEachStageInFp32) {
  // Ψ = 10^6 over N = 8 (S = 125,000): fp32 params and grads 4 bytes, AdamW 8, no master weights.
  PlanInput input{.params = 1'000'000, .world_size = 8};
  const auto bytes = [&](int stage) {
    input.stage = stage;
    const ModelStateBytes b = model_state_bytes(input);
    return std::make_tuple(b.params, b.grads, b.master_weights, b.optimizer_state);
  };
  EXPECT_EQ(bytes(0), std::make_tuple(4'000'000, 4'000'000, 0, 8'000'000));  // 16Ψ
  EXPECT_EQ(bytes(1), std::make_tuple(4'000'000, 4'000'000, 0, 1'000'000));  // 8Ψ + 8Ψ/N
  EXPECT_EQ(bytes(2), std::make_tuple(4'000'000, 500'000, 0, 1'000'000));    // 4Ψ + 12Ψ/N
  EXPECT_EQ(bytes(3), std::make_tuple(500'000, 500'000, 0, 1'000'000));      // 16Ψ/N
}

TEST(Plan, MixedPrecisionAddsMasterWeightsWhereTheOptimizerStateIs) {
  const PlanInput input{.params = 1'000'000, .world_size = 8, .stage = 2, .precision = DType::kF16};
  const ModelStateBytes b = model_state_bytes(input);
  EXPECT_EQ(b.params, 2'000'000);        // 2Ψ
  EXPECT_EQ(b.grads, 250'000);           // 2Ψ/N
  EXPECT_EQ(b.master_weights, 500'000);  // 4Ψ/N
  EXPECT_EQ(b.optimizer_state, 1'000'000);
}

TEST(Plan, PaddingIsShardedButStageZeroUpdatesOnlyTheParameters) {
  // Ψ = 10 over N = 4 pads to Ψp = 12, S = 3.
  PlanInput input{.params = 10, .world_size = 4, .optimizer_state_bytes = 4};
  EXPECT_EQ(input.padded(), 12);
  ModelStateBytes b = model_state_bytes(input);
  EXPECT_EQ(b.params, 48);
  EXPECT_EQ(b.optimizer_state, 40);  // 4 bytes x 10 parameters
  input.stage = 3;
  b = model_state_bytes(input);
  EXPECT_EQ(b.params, 12);
  EXPECT_EQ(b.optimizer_state, 12);  // 4 bytes x 3
}

TEST(Plan, BytesSentPerStep) {
  // Ψ = 10^6, N = 4, bf16: one reduce-scatter or allgather sends 2 bytes x 250,000 x 3 = 1.5e6 bytes.
  using Sent = std::pair<int64_t, int64_t>;  // (param_gather, grad_reduce)
  PlanInput input{.params = 1'000'000, .world_size = 4, .precision = DType::kBF16};
  const auto sent = [&](int stage, int accumulation) {
    input.stage = stage;
    input.accumulation_steps = accumulation;
    const CommBytes c = comm_bytes_per_step(input);
    return Sent{c.param_gather, c.grad_reduce};
  };
  EXPECT_EQ(sent(0, 1), Sent(0, 3'000'000));  // 2Ψ(N-1)/N elements, 2 bytes each
  EXPECT_EQ(sent(1, 1), Sent(1'500'000, 1'500'000));
  EXPECT_EQ(sent(2, 1), Sent(1'500'000, 1'500'000));
  EXPECT_EQ(sent(3, 1), Sent(3'000'000, 1'500'000));  // 3Ψ(N-1)/N in all
  EXPECT_EQ(sent(0, 2), Sent(0, 6'000'000));
  EXPECT_EQ(sent(2, 2), Sent(1'500'000, 3'000'000));  // one allgather after the update
  EXPECT_EQ(sent(3, 2), Sent(6'000'000, 3'000'000));
  input.world_size = 1;
  EXPECT_EQ(comm_bytes_per_step(input).total(), 0);
}

TEST(Plan, LargestModelInEightyGigabytes) {
  // fp32 + AdamW on N = 4: stage 0 needs 16Ψ, stage 1 40 bytes per S = Ψ/4, stage 3 16 per S.
  PlanInput input{.world_size = 4};
  const int64_t budget = 80'000'000'000;
  input.stage = 0;
  EXPECT_EQ(largest_params_that_fit(input, budget), 5'000'000'000);
  input.stage = 1;
  EXPECT_EQ(largest_params_that_fit(input, budget), 8'000'000'000);
  input.stage = 3;
  EXPECT_EQ(largest_params_that_fit(input, budget), 20'000'000'000);
  EXPECT_EQ(largest_params_that_fit(input, budget, 16'000'000'000), 16'000'000'000);  // 64e9 left
  EXPECT_EQ(largest_params_that_fit(input, budget, budget + 1), 0);
}

TEST(Plan, LargestModelIsTheFitBoundaryWithPadding) {
  // Budgets that are not multiples of anything: the answer fits and one more parameter does not.
  for (int stage = 0; stage <= 3; ++stage) {
    for (const int64_t budget : {int64_t{1'000'003}, int64_t{999'999'937}}) {
      PlanInput input{.world_size = 6, .stage = stage, .precision = DType::kBF16};
      const int64_t fit = largest_params_that_fit(input, budget, 1001);
      input.params = fit;
      EXPECT_LE(model_state_bytes(input).total() + 1001, budget) << "stage " << stage;
      input.params = fit + 1;
      EXPECT_GT(model_state_bytes(input).total() + 1001, budget) << "stage " << stage;
    }
  }
}

TEST(Plan, InvalidInputNamesTheField) {
  EXPECT_THAT(std::string(PlanInput{.stage = 4}.validate().message()), HasSubstr("stage = 4"));
  EXPECT_THAT(std::string(PlanInput{.world_size = 0}.validate().message()), HasSubstr("world_size = 0"));
  EXPECT_THAT(std::string(PlanInput{.precision = DType::kI32}.validate().message()), HasSubstr("precision = int32"));
  EXPECT_THAT(std::string(PlanInput{.params = 10, .padded_params = 11, .world_size = 4}.validate().message()),
              HasSubstr("padded_params = 11"));
  EXPECT_THAT(std::string(PlanInput{.accumulation_steps = 0}.validate().message()), HasSubstr("accumulation_steps"));
  EXPECT_THAT(std::string(PlanInput{.stage = 2, .offload_param = true}.validate().message()),
              HasSubstr("stage = 2; offload_param moves the parameter shards of stage 3"));
}

// --- The engine measures what the plan says ---

struct Measured {
  testing::RankResult rank0;
  int64_t params = 0;
};

// What goes to files: the optimizer (master weights and state) and, at stage 3, the parameter shards.
struct Offload {
  bool optimizer = false;
  bool params = false;
};

Measured train_toy(const testing::ToyConfig& model, int stage, DType precision, OptimizerFactory optimizer,
                   int accumulation, Offload offload = {}) {
  testing::TrainRun run{.model = model, .world_size = 4, .steps = 2, .optimizer = std::move(optimizer)};
  const testing::ScopedTempDir files;
  run.zero.offload_optimizer_path = offload.optimizer ? files.path().string() : "";
  run.zero.offload_param_path = offload.params ? files.path().string() : "";
  run.zero.stage = stage;
  run.zero.precision = precision;
  run.zero.accumulation_steps = accumulation;
  run.zero.persistence_threshold = 0;         // every unit sharded, as the plan assumes
  run.zero.loss_scaling.initial_scale = 256;  // fp16: no overflow, so the last step updates and gathers
  testing::LocalOutcome out = testing::train_local(run);
  ZERO_CHECK(out.status.ok(), out.status.ToString());
  Measured m{.rank0 = out.ranks[0]};
  testing::ToyModel toy(model);
  for (Unit* u : toy.units()) {
    for (const ParamSpec& p : u->param_specs()) m.params += shape_numel(p.shape);
  }
  return m;
}

class PlanMatchesEngine : public ::testing::TestWithParam<std::tuple<DType, bool>> {
 protected:
  DType precision() const { return std::get<0>(GetParam()); }
  bool adamw() const { return std::get<1>(GetParam()); }
  OptimizerFactory optimizer() const { return adamw() ? testing::adamw_factory() : testing::sgd_factory(); }
  PlanInput plan(const Measured& m, int stage, int accumulation, Offload offload = {}) const {
    return {.params = m.params,
            .padded_params = m.rank0.padded_params,
            .world_size = 4,
            .stage = stage,
            .precision = precision(),
            .optimizer_state_bytes = adamw() ? 8 : 0,
            .accumulation_steps = accumulation,
            .offload_optimizer = offload.optimizer,
            .offload_param = offload.params};
  }
};

TEST_P(PlanMatchesEngine, PeakModelStateBytesPerCategory) {
  const testing::ToyConfig model{.features = 31, .hidden = 97, .hidden_layers = 3};  // units not multiples of 4
  for (Offload offload :
       {Offload{}, Offload{.optimizer = true}, Offload{.params = true}, Offload{.optimizer = true, .params = true}}) {
    for (int stage = offload.params ? 3 : 0; stage <= 3; ++stage) {
      const Measured m = train_toy(model, stage, precision(), optimizer(), 1, offload);
      ASSERT_GT(m.rank0.padded_params, m.params) << "the model should need padding";
      const ModelStateBytes want = model_state_bytes(plan(m, stage, 1, offload));
      const MemoryStats& got = m.rank0.memory;
      const std::string where = absl::StrCat("stage ", stage, offload.optimizer ? ", optimizer offloaded" : "",
                                             offload.params ? ", parameters offloaded" : "");
      EXPECT_EQ(got.peak_of(MemoryCategory::kParams), want.params) << where;
      EXPECT_EQ(got.peak_of(MemoryCategory::kGrads), want.grads) << where;
      EXPECT_EQ(got.peak_of(MemoryCategory::kMasterWeights), want.master_weights) << where;
      EXPECT_EQ(got.peak_of(MemoryCategory::kOptimizerState), want.optimizer_state) << where;
      const MemoryStats& held = m.rank0.held_at_end;
      EXPECT_EQ(held.in_files_of(MemoryCategory::kMasterWeights) + held.in_files_of(MemoryCategory::kOptimizerState) +
                    held.in_files_of(MemoryCategory::kParams),
                want.in_files)
          << where;
    }
  }
}

TEST_P(PlanMatchesEngine, BytesSentPerStep) {
  // The formula gathers every unit in every forward and backward. Stage 3 keeps a unit gathered when the
  // next gathers need it again (Engine::release), so per micro-batch of the untied model the head is
  // gathered once, kept from its forward into its backward, and between micro-batches the input layer is
  // kept from one's backward into the next one's forward. With the head tied to input.weight, the head's
  // forward gathers the input unit once more and its backward finds both kept: the head once per
  // micro-batch, the input layer once more per step than the formula. Everything else is the formula's.
  const auto one_gather = [&](int64_t numel) {  // bytes a rank sends allgathering a unit over 4 ranks
    return static_cast<int64_t>(dtype_size(precision())) * ((numel + 3) / 4) * 3;
  };
  const int64_t input = one_gather(97 * 31 + 97);
  for (bool tied : {false, true}) {
    const testing::ToyConfig model{.features = 31, .hidden = 97, .hidden_layers = 3, .tied_head = tied};
    const int64_t head = one_gather(tied ? 31 : 31 + 97 * 31);
    for (int accumulation : {1, 2}) {
      for (int stage = 0; stage <= 3; ++stage) {
        const Measured m = train_toy(model, stage, precision(), optimizer(), accumulation);
        CommBytes want = comm_bytes_per_step(plan(m, stage, accumulation));
        if (stage == 3) {
          want.param_gather -= accumulation * head + (tied ? -input : (accumulation - 1) * input);
        }
        const CommVolume& got = m.rank0.last_step;
        const std::string where = absl::StrCat(tied ? "tied" : "untied", " stage ", stage, " A ", accumulation);
        EXPECT_EQ(got.param_gather, want.param_gather) << where;
        EXPECT_EQ(got.grad_reduce, want.grad_reduce) << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PrecisionsAndOptimizers, PlanMatchesEngine,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_adamw" : "_sgd");
                         });

}  // namespace
}  // namespace zero
