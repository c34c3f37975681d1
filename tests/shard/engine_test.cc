// The engine: stages 0-3 agree bit for bit, match single-rank training, and hold and send what the formulas say.
#include "shard/engine.h"

#include <atomic>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "runtime/comm/local.h"
#include "runtime/device.h"
#include "runtime/file_memory.h"
#include "runtime/status.h"
#include "tests/shard/toy_training.h"
#include "tests/temp_dir.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using testing::ToyConfig;
using testing::ToyModel;

using testing::bitwise_equal;
using testing::sgd_factory;
using testing::train_local;
using testing::TrainRun;

// Rank 0's parameters and step results, every rank's memory and last-step volume, and the run's status.
struct Outcome {
  std::vector<float> params;
  std::vector<StepResult> steps;
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
  out.steps = local.ranks[0].steps;
  out.padded_params = local.ranks[0].padded_params;
  for (const testing::RankResult& r : local.ranks) {
    out.memory.push_back(r.memory);
    out.volume.push_back(r.last_step);
  }
  return out;
}

class StagesAgree : public ::testing::TestWithParam<std::tuple<int, int, DType>> {};

TEST_P(StagesAgree, AllStagesGiveBitIdenticalParameters) {
  const auto [world_size, accumulation, precision] = GetParam();
  TrainRun run{.world_size = world_size};
  run.zero.accumulation_steps = accumulation;
  run.zero.precision = precision;
  run.zero.loss_scaling.initial_scale = 256;  // fp16: no overflow, so every step updates
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
    ASSERT_FALSE(out.steps.back().skipped);
    if (stage == 0) {
      reference = out.params;
      ASSERT_FALSE(reference.empty());
      continue;
    }
    EXPECT_TRUE(bitwise_equal(out.params, reference)) << "stage " << stage << " differs from stage 0";
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizesAccumulationPrecision, StagesAgree,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8), ::testing::Values(1, 2),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16)),
                         [](const auto& info) {
                           return absl::StrCat("N", std::get<0>(info.param), "_A", std::get<1>(info.param), "_",
                                               dtype_name(std::get<2>(info.param)));
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

TEST(Engine, EvaluateIsTrainingsForwardAndLeavesTrainingUnchanged) {
  for (int stage : {0, 1, 3}) {
    TrainRun run{.world_size = 2, .steps = 3};
    run.zero.stage = stage;
    run.zero.persistence_threshold = 0;
    const testing::LocalOutcome plain = train_local(run);
    run.evaluate_first = true;
    const testing::LocalOutcome evaluated = train_local(run);
    ASSERT_TRUE(plain.status.ok() && evaluated.status.ok()) << evaluated.status;
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(bitwise_equal(evaluated.ranks[r].params, plain.ranks[r].params)) << "stage " << stage;
    }
    // The step's loss is the ranks' forward losses summed in rank order and averaged, as here.
    for (int k = 0; k < run.steps; ++k) {
      const float mean = (evaluated.ranks[0].evaluations[k].loss + evaluated.ranks[1].evaluations[k].loss) / 2.0f;
      EXPECT_EQ(mean, plain.ranks[0].steps[k].loss) << "stage " << stage << ", step " << k;
      EXPECT_EQ(evaluated.ranks[0].evaluations[k].predictions + evaluated.ranks[1].evaluations[k].predictions,
                plain.ranks[0].steps[k].predictions);
    }
  }
}

TEST(Engine, EvaluateLeavesNoActivationsBehind) {
  for (int64_t wrap : {0, 150}) {  // units on their own, and merged into groups
    const std::vector<absl::Status> statuses = run_local_ranks(2, [&](Communicator& comm) -> absl::Status {
      Allocator allocator(comm.rank());
      const ToyConfig config;
      ToyModel model(config);
      ZERO_ASSIGN_OR_RETURN(
          std::unique_ptr<Engine> engine,
          Engine::create(model, comm, allocator, testing::adamw_factory(),
                         ZeroConfig{.stage = 3, .wrap_min_params = wrap, .persistence_threshold = 0}));
      testing::ToyData data = testing::toy_rows(config, 8 * comm.rank(), 8 * comm.rank() + 8);
      int64_t output_rows = 0;
      ZERO_ASSIGN_OR_RETURN(const Evaluation e, engine->evaluate(data.batch(config.features), [&](const Tensor& out) {
        output_rows = out.size(0);
        return absl::OkStatus();
      }));
      EXPECT_EQ(e.predictions, 8);
      EXPECT_EQ(output_rows, 8) << "on_output sees the last unit's output";
      EXPECT_EQ(allocator.stats().current_of(MemoryCategory::kActivations), 0) << "wrap " << wrap;
      EXPECT_EQ(allocator.stats().current_of(MemoryCategory::kCommBuffers), 0) << "no gathered unit left";
      return absl::OkStatus();
    });
    EXPECT_TRUE(root_cause(statuses).ok()) << root_cause(statuses);
  }
}

// --- Stage 3: prefetch in the recorded order, and units that sit out ---

class SittingOut : public ::testing::TestWithParam<int64_t> {};  // the wrap policy's min_params

TEST_P(SittingOut, AUnitThatSitsOutEveryOtherStepTrainsBitIdenticallyAtEveryStage) {
  // hidden_0 sits out steps 1, 3 and 5, so every step leaves the order the step before recorded: stage 3
  // stops prefetching there, gathers on demand and records again. Evaluation skips it too. Wrapped at 200,
  // hidden_0 shares a flat unit with the input layer, and the group runs without it.
  TrainRun run{
      .model = {.hidden_layers = 3, .hidden_0_sits_out_every = 2}, .world_size = 3, .steps = 6, .evaluate_first = true};
  run.zero.persistence_threshold = 0;
  run.zero.accumulation_steps = 2;
  run.zero.wrap_min_params = GetParam();
  testing::LocalOutcome reference;
  for (int stage = 0; stage <= 3; ++stage) {
    run.zero.stage = stage;
    const testing::LocalOutcome out = train_local(run);
    ASSERT_TRUE(out.status.ok()) << "stage " << stage << ": " << out.status;
    if (stage == 0) {
      reference = out;
      continue;
    }
    EXPECT_TRUE(bitwise_equal(out.ranks[0].params, reference.ranks[0].params)) << "stage " << stage;
    ASSERT_EQ(out.ranks[0].evaluations.size(), reference.ranks[0].evaluations.size());
    for (size_t e = 0; e < out.ranks[0].evaluations.size(); ++e) {
      EXPECT_EQ(out.ranks[0].evaluations[e].loss, reference.ranks[0].evaluations[e].loss) << "stage " << stage;
    }
  }
  run.model.hidden_0_sits_out_every = 0;
  EXPECT_FALSE(bitwise_equal(train_local(run).ranks[0].params, reference.ranks[0].params))
      << "sitting out should have changed the training";
}

INSTANTIATE_TEST_SUITE_P(Unwrapped, SittingOut, ::testing::Values(0));
INSTANTIATE_TEST_SUITE_P(Wrapped, SittingOut, ::testing::Values(200));

TEST(SittingOut, TheFirstUnitCannotSitOut) {
  // A model that starts at the toy's hidden_0, which sits out every step.
  ToyModel toy({.hidden_layers = 1, .tied_head = false, .hidden_0_sits_out_every = 1});
  class FromHidden final : public Model {
   public:
    explicit FromHidden(Model& toy) : toy_(toy) {}
    std::vector<Unit*> units() override {
      const std::vector<Unit*> all = toy_.units();
      return {all.begin() + 1, all.end()};
    }

   private:
    Model& toy_;
  } model(toy);
  const absl::Status status = root_cause(run_local_ranks(1, [&](Communicator& comm) -> absl::Status {
    Allocator allocator;
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                          Engine::create(model, comm, allocator, testing::adamw_factory(), ZeroConfig{}));
    testing::ToyData data = testing::toy_rows(ToyConfig{}, 0, 4);
    const Batch batch = data.batch(7);
    return engine->train_step({&batch, 1}, 0.1f).status();
  }));
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("unit 'hidden_0' sat out a micro-batch (Unit::runs), but "
                                                       "the first unit always runs"));
}

TEST(Stage3Prefetch, AtMostMaxLiveUnitsAreGatheredAtOnce) {
  // Six equal hidden units of 301·301 + 301 elements: the gathered copies alive at once, plus the two
  // gradient buckets backward may hold (one reducing, one filling), plus the input layer's bucket, which
  // the tied head opens and which lives through the whole backward, bound comm_buffers from above;
  // prefetch fills the bound. With hidden_0 sitting out every other step, each step leaves the order
  // recorded on the one before: prefetch stops there, and the bound holds too.
  const int64_t unit_bytes = (301 * 301 + 301) * 4;
  const int64_t input_bytes = (301 * 31 + 301) * 4;
  for (int live : {1, 2, 3}) {
    for (int sits_out_every : {0, 2}) {
      const ToyConfig wide{
          .features = 31, .hidden = 301, .hidden_layers = 6, .hidden_0_sits_out_every = sits_out_every};
      TrainRun run{.model = wide, .world_size = 2, .steps = 3};
      run.zero.stage = 3;
      run.zero.persistence_threshold = 0;
      run.zero.max_live_units = live;
      const Outcome out = train(run);
      ASSERT_TRUE(out.status.ok()) << out.status;
      const int64_t peak = out.memory[0].peak_of(MemoryCategory::kCommBuffers);
      EXPECT_GE(peak, live * unit_bytes) << live << " live units";
      EXPECT_LE(peak, (live + 2) * unit_bytes + input_bytes) << live << " live units, sitting out " << sits_out_every;
    }
  }
}

TEST(Stage3Prefetch, EvaluationGathersAheadUpToMaxLiveUnits) {
  // Evaluation knows its gathers in advance and prefetches along them: with no step taken, the peak of
  // comm_buffers is exactly max_live_units of the six equal hidden units (no gradient buckets).
  const ToyConfig wide{.features = 31, .hidden = 301, .hidden_layers = 6};
  const int64_t unit_bytes = (301 * 301 + 301) * 4;
  for (int live : {1, 2, 3}) {
    const std::vector<absl::Status> statuses = run_local_ranks(2, [&](Communicator& comm) -> absl::Status {
      Allocator allocator(comm.rank());
      ToyModel model(wide);
      ZeroConfig config{.stage = 3, .max_live_units = live, .persistence_threshold = 0};
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                            Engine::create(model, comm, allocator, testing::adamw_factory(), config));
      testing::ToyData data = testing::toy_rows(wide, 4 * comm.rank(), 4 * comm.rank() + 4);
      ZERO_RETURN_IF_ERROR(engine->evaluate(data.batch(wide.features)).status());
      EXPECT_EQ(allocator.stats().peak_of(MemoryCategory::kCommBuffers), live * unit_bytes) << live << " live units";
      EXPECT_EQ(allocator.stats().current_of(MemoryCategory::kCommBuffers), 0) << "nothing left gathered";
      return absl::OkStatus();
    });
    EXPECT_TRUE(root_cause(statuses).ok()) << root_cause(statuses);
  }
}

TEST(Stage3Order, RanksThatSitOutDifferentlyFailOnEveryRankNamingTheDivergence) {
  // Only rank 1's hidden_0 sits out step 1: its gathers no longer match the other ranks'. The local
  // backend compares what every rank issues at each collective, debug mode or not.
  TrainRun run{
      .model = {.hidden_layers = 2, .hidden_0_sits_out_every = 2, .sit_out_rank = 1}, .world_size = 3, .steps = 3};
  run.zero.stage = 3;
  run.zero.persistence_threshold = 0;
  for (bool debug : {false, true}) {
    const std::vector<absl::Status> statuses = run_local_ranks(
        3, [&](Communicator& comm) { return testing::train_rank(comm, run).status(); },
        CommOptions{.timeout = absl::Seconds(60), .debug_collectives = debug});
    for (int r = 0; r < 3; ++r) EXPECT_FALSE(statuses[r].ok()) << "rank " << r << (debug ? ", debug" : "");
    const std::string message(root_cause(statuses).message());
    EXPECT_THAT(message, HasSubstr("ranks diverged in their collective sequence: ranks 0, 2 issued")) << message;
    EXPECT_THAT(message, HasSubstr("rank 1 issued")) << message;
  }
}

// Two ranks train the toy model three steps at stage 3 with phases timed (or not); rank 1 dawdles for
// `rank_1_pause` before each step(), and before an evaluation at the end. Each rank's phase times.
absl::StatusOr<std::vector<PhaseTimes>> phase_times(bool time_phases, absl::Duration rank_1_pause) {
  std::vector<PhaseTimes> times(2);
  ZERO_RETURN_IF_ERROR(root_cause(run_local_ranks(2, [&](Communicator& comm) -> absl::Status {
    Allocator allocator(comm.rank());  // outlives the model, which keeps what backward relays to the input
    ToyModel model(ToyConfig{});
    ZeroConfig zero{.stage = 3, .persistence_threshold = 0, .time_phases = time_phases};
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                          Engine::create(model, comm, allocator, testing::adamw_factory(), zero));
    testing::ToyData data = testing::toy_rows(ToyConfig{}, 4 * comm.rank(), 4 * comm.rank() + 4);
    const Batch batch = data.batch(ToyConfig{}.features);
    for (int step = 0; step < 3; ++step) {
      ZERO_RETURN_IF_ERROR(engine->forward_backward(batch));
      if (comm.rank() == 1) absl::SleepFor(rank_1_pause);
      ZERO_RETURN_IF_ERROR(engine->step(0.1f).status());
    }
    if (comm.rank() == 1) absl::SleepFor(rank_1_pause);
    ZERO_RETURN_IF_ERROR(engine->evaluate(batch).status());  // outside the phases: not timed
    times[comm.rank()] = engine->phase_times();
    return absl::OkStatus();
  })));
  return times;
}

TEST(PhaseTimes, WaitingIsTheTimeARankWasBlockedOnAPeer) {
  // Rank 0 finishes its backward and then waits in step()'s loss allreduce until rank 1 has paused.
  const absl::Duration pause = absl::Milliseconds(200);
  const absl::StatusOr<std::vector<PhaseTimes>> times = phase_times(true, pause);
  ASSERT_TRUE(times.ok()) << times.status();
  for (const PhaseTimes& t : *times) {
    EXPECT_GT(t.forward, absl::ZeroDuration());
    EXPECT_GT(t.backward, absl::ZeroDuration());
    // Waiting is counted inside the phases only: rank 0's wait in the evaluation's gathers is not.
    EXPECT_LE(t.waiting, t.forward + t.backward + t.update);
  }
  // Both ranks leave backward's last reduction together, so rank 0 reaches the allreduce at most a
  // scheduling delay (on a loaded CI machine, milliseconds) after rank 1 starts its pause.
  const absl::Duration late = absl::Milliseconds(50);
  EXPECT_GE((*times)[0].update, 3 * (pause - late));
  EXPECT_GE((*times)[0].waiting, 3 * (pause - late));
  EXPECT_LT((*times)[1].update, 3 * pause);  // rank 1's pause falls between its phases
}

TEST(PhaseTimes, NothingIsTimedUnlessAskedFor) {
  const absl::StatusOr<std::vector<PhaseTimes>> times = phase_times(false, absl::ZeroDuration());
  ASSERT_TRUE(times.ok()) << times.status();
  for (const PhaseTimes& t : *times) {
    EXPECT_EQ(t.forward + t.backward + t.update + t.waiting, absl::ZeroDuration());
  }
}

// Rank 0's allreduces in one toy step of `zero.accumulation_steps` micro-batches on `ranks` local ranks, and the
// most bucket staging (comm_buffers) it held at once.
struct ToyStepCounts {
  int64_t allreduces = 0;
  int64_t staged_bytes = 0;
};
absl::StatusOr<ToyStepCounts> toy_step_counts(int ranks, const ZeroConfig& zero) {
  ToyStepCounts counts;
  const absl::Status status = root_cause(run_local_ranks(ranks, [&](Communicator& comm) -> absl::Status {
    Allocator allocator;
    ToyModel model(ToyConfig{});
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                          Engine::create(model, comm, allocator, testing::adamw_factory(), zero));
    testing::ToyData data = testing::toy_rows(ToyConfig{}, 0, 4);
    const Batch batch = data.batch(ToyConfig{}.features);
    comm.reset_stats();
    ZERO_RETURN_IF_ERROR(engine->train_step(std::vector<Batch>(zero.accumulation_steps, batch), 0.1f).status());
    if (comm.rank() == 0) {
      counts = {.allreduces = comm.stats().of(CollectiveOp::kAllreduce).calls,
                .staged_bytes = allocator.stats().peak_of(MemoryCategory::kCommBuffers)};
    }
    return absl::OkStatus();
  }));
  if (!status.ok()) return status;
  return counts;
}

TEST(EngineBuckets, StageZeroCapsCountBytesOfTheTrainingDtype) {
  // The toy's units in backward order hold 7, 182, 182 and 104 elements. With 1000-byte caps, fp32 needs
  // three buckets ({head, hidden_1}, {hidden_0}, {input}); bf16's 950 bytes fit one. Each bucket is one
  // allreduce, beside the step's two metric allreduces (the loss in fp32, the counts as integers). Two ranks: one
  // alone has nothing to reduce, and buckets none.
  for (const auto& [precision, buckets] : {std::pair{DType::kF32, 3}, std::pair{DType::kBF16, 1}}) {
    const absl::StatusOr<ToyStepCounts> counts =
        toy_step_counts(2, {.bucket_cap_bytes = 1000, .first_bucket_cap_bytes = 1000, .precision = precision});
    ASSERT_TRUE(counts.ok()) << counts.status();
    EXPECT_EQ(counts->allreduces, buckets + 2) << dtype_name(precision);
  }
}

TEST(EngineBuckets, OneRankWithOneMicroBatchReducesAndStagesNothing) {
  // Stage 0 on one rank, one micro-batch a step: the backward adds into the held gradients directly, so the only
  // allreduces are the step's two metric ones and no bucket staging is ever allocated; with two micro-batches each
  // is scaled and reduced through its four buckets again.
  for (const auto& [accumulation, allreduces] : {std::pair{1, 2}, std::pair{2, 2 * 4 + 2}}) {
    const absl::StatusOr<ToyStepCounts> counts =
        toy_step_counts(1, {.bucket_cap_bytes = 1, .first_bucket_cap_bytes = 1, .accumulation_steps = accumulation});
    ASSERT_TRUE(counts.ok()) << counts.status();
    EXPECT_EQ(counts->allreduces, allreduces) << accumulation << " micro-batches";
    EXPECT_EQ(counts->staged_bytes > 0, accumulation > 1) << accumulation << " micro-batches";
  }
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

TEST(Engine, LossFallsOnTheToyTaskInEveryPrecision) {
  for (DType precision : {DType::kF32, DType::kBF16, DType::kF16}) {
    TrainRun run{.world_size = 2, .steps = 30, .lr = 0.02f};
    run.zero.stage = 3;
    run.zero.precision = precision;
    const Outcome out = train(run);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_LT(out.steps.back().loss, 0.8f * out.steps.front().loss) << precision;
  }
}

// --- no_sync: stages 0-1 accumulate locally and reduce once per step ---

TEST(NoSync, ReducesOncePerStepAndStagesZeroAndOneAgree) {
  TrainRun run{.world_size = 3, .optimizer = sgd_factory()};
  run.zero.accumulation_steps = 4;
  run.zero.first_bucket_cap_bytes = 200;
  run.zero.bucket_cap_bytes = 600;
  run.zero.no_sync = true;
  run.zero.stage = 0;
  const Outcome ddp = train(run);
  run.zero.stage = 1;
  const Outcome zero1 = train(run);
  ASSERT_TRUE(ddp.status.ok() && zero1.status.ok()) << ddp.status << zero1.status;
  EXPECT_TRUE(bitwise_equal(ddp.params, zero1.params)) << "the same sums, reduced in the same rank order";

  run.zero.no_sync = false;
  run.zero.stage = 0;
  const Outcome every = train(run);
  ASSERT_TRUE(every.status.ok()) << every.status;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ddp.volume[r].grad_reduce * 4, every.volume[r].grad_reduce) << "one allreduce per step, not four";
  }
  // Only where the sum is rounded differs: each gradient element sums 16 per-row terms either way, so it
  // agrees to a few fp32 ulps, and three SGD steps of lr 0.05 keep parameters within 1e-6 of each other.
  ASSERT_EQ(ddp.params.size(), every.params.size());
  for (size_t i = 0; i < ddp.params.size(); ++i) {
    EXPECT_NEAR(ddp.params[i], every.params[i], 1e-6f * std::max(1.0f, std::fabs(every.params[i]))) << i;
  }
}

// A micro-batch more than accumulation_steps before step() is refused naming the fix; step() then still takes the
// step's own micro-batches.
TEST(Engine, AMicroBatchPastAccumulationStepsIsRefusedNamingStep) {
  const absl::Status status = root_cause(run_local_ranks(1, [&](Communicator& comm) -> absl::Status {
    Allocator allocator;  // outlives the model, which holds activations between micro-batches
    ToyModel model(ToyConfig{});
    ZERO_ASSIGN_OR_RETURN(
        std::unique_ptr<Engine> engine,
        Engine::create(model, comm, allocator, testing::adamw_factory(), ZeroConfig{.accumulation_steps = 2}));
    testing::ToyData data = testing::toy_rows(ToyConfig{}, 0, 4);
    const Batch batch = data.batch(7);
    ZERO_RETURN_IF_ERROR(engine->forward_backward(batch));
    ZERO_RETURN_IF_ERROR(engine->forward_backward(batch));
    const absl::Status third = engine->forward_backward(batch);
    EXPECT_EQ(third, absl::FailedPreconditionError(
                         "forward_backward after 2 micro-batches; accumulation_steps is 2: call step() first"));
    return engine->step(0.1f).status();
  }));
  EXPECT_TRUE(status.ok()) << status;
}

TEST(DelayedUpdateConfig, NeedsTheOptimizerOnTheHostAndTheParameterShardsOnTheDevice) {
  ZeroConfig c{.stage = 3, .delayed_update_after = 0};
  c.device = Device::sim(0);
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("needs offload_optimizer_to_host"));
  c.offload_optimizer_to_host = true;
  EXPECT_TRUE(c.validate().ok()) << c.validate();
  c.offload_param_to_host = true;
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("the parameter shards on the device"));
  c.offload_param_to_host = false;
  c.delayed_update_after = -2;
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("ZeroConfig.delayed_update_after = -2"));
}

// The optimizers divide the gradients by the loss scale in fp32: a scale past a float's range is refused up front.
TEST(LossScalingConfig, ScalesBeyondAFloatAreRefused) {
  ZeroConfig c;
  c.precision = DType::kF16;
  EXPECT_TRUE(c.validate().ok()) << c.validate();
  c.loss_scaling.initial_scale = 1e39;
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("the scales at most 3.4e38"));
  c.loss_scaling.initial_scale = 65536;
  c.loss_scaling.static_scale = 1e39;
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("the scales at most 3.4e38"));
}

TEST(NoSync, RefusedAtStagesTwoAndThree) {
  ZeroConfig c;
  c.no_sync = true;
  c.stage = 2;
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("ZeroConfig.no_sync = true"));
  c.stage = 1;
  EXPECT_TRUE(c.validate().ok());
}

// --- fp16 dynamic loss scaling ---

TEST(LossScaling, OverflowSkipsTheStepOnEveryRankAndHalvesTheScaleAfterTheHysteresis) {
  // 2^40 times any gradient of this size is far above fp16's 65504: the first steps overflow.
  TrainRun run{.world_size = 4, .steps = 40};
  run.zero.stage = 3;
  run.zero.precision = DType::kF16;
  run.zero.loss_scaling.initial_scale = std::ldexp(1.0, 40);
  const testing::LocalOutcome out = train_local(run);
  ASSERT_TRUE(out.status.ok()) << out.status;
  const std::vector<StepResult>& steps = out.ranks[0].steps;
  ASSERT_TRUE(steps[0].skipped && steps[1].skipped);
  EXPECT_EQ(steps[1].loss_scale, steps[0].loss_scale) << "hysteresis 2: the first overflow keeps the scale";
  int skipped = 0;
  while (skipped < run.steps && steps[skipped].skipped) ++skipped;
  ASSERT_LT(skipped, run.steps) << "the scale never came down far enough";
  for (int k = 1; k < skipped; ++k) EXPECT_EQ(steps[k + 1].loss_scale, steps[k].loss_scale / 2) << "step " << k;
  for (int k = skipped; k < run.steps; ++k) {
    EXPECT_FALSE(steps[k].skipped) << "step " << k;  // window 1000: the scale stays where it fit
    EXPECT_EQ(steps[k].loss_scale, steps[skipped].loss_scale);
  }
  for (const testing::RankResult& rank : out.ranks) {
    for (int k = 0; k < run.steps; ++k) EXPECT_EQ(rank.steps[k].skipped, steps[k].skipped) << "step " << k;
    EXPECT_TRUE(bitwise_equal(rank.params, out.ranks[0].params));
  }

  // The skipped steps left the parameters as initialized.
  const Outcome untrained = train(TrainRun{.zero = run.zero, .world_size = 4, .steps = 0});
  run.steps = skipped;
  const Outcome only_skipped = train(run);
  ASSERT_TRUE(untrained.status.ok() && only_skipped.status.ok());
  EXPECT_TRUE(bitwise_equal(only_skipped.params, untrained.params));
}

TEST(LossScaling, AnOverflowInOneRanksGradientSkipsTheStepOnEveryRank) {
  // Rank 1 writes +inf into hidden_0's first weight gradient in step 0. From stage 1 on, the reduction
  // lands it in rank 0's shard alone, so the skip must come from the ranks agreeing, not each looking.
  for (int stage = 0; stage <= 3; ++stage) {
    TrainRun run{.world_size = 2, .steps = 2};
    run.zero.stage = stage;
    run.zero.persistence_threshold = 0;
    run.zero.precision = DType::kF16;
    run.zero.loss_scaling.initial_scale = 256;
    std::atomic<bool> injected = false;  // once: a skipped step leaves ctx.step where it was
    run.hooks.after_backward = [&](const UnitContext& ctx, absl::string_view unit, const ParamViews& grads) {
      if (ctx.allocator.rank() != 1 || unit != "hidden_0" || injected.exchange(true)) return;
      const Tensor& g = grads.at("weight");
      ASSERT_EQ(g.dtype(), DType::kF16);
      *static_cast<uint16_t*>(g.data()) = 0x7C00;  // fp16 +inf
    };
    const testing::LocalOutcome out = train_local(run);
    ASSERT_TRUE(out.status.ok()) << out.status;
    run.hooks = {};
    run.steps = 1;
    run.first_step = 1;
    const Outcome only_second = train(run);  // step 1 alone, from the initial parameters and state
    for (const testing::RankResult& rank : out.ranks) {
      EXPECT_TRUE(rank.steps[0].skipped) << "stage " << stage << " rank " << &rank - out.ranks.data();
      EXPECT_FALSE(rank.steps[1].skipped) << "stage " << stage;
      EXPECT_TRUE(bitwise_equal(rank.params, out.ranks[0].params)) << "stage " << stage;
    }
    EXPECT_EQ(out.ranks[0].steps[1].loss_scale, 256) << "hysteresis 2: one overflow keeps the scale";
    ASSERT_TRUE(only_second.status.ok()) << only_second.status;
    EXPECT_TRUE(bitwise_equal(only_second.params, out.ranks[0].params))
        << "stage " << stage << ": the skip left a trace";
  }
}

TEST(LossScaling, ScaleDoublesAfterEachWindowOfGoodSteps) {
  TrainRun run{.world_size = 2, .steps = 7};
  run.zero.precision = DType::kF16;
  run.zero.loss_scaling.initial_scale = 16;
  run.zero.loss_scaling.window = 2;
  const Outcome out = train(run);
  ASSERT_TRUE(out.status.ok()) << out.status;
  for (int k = 0; k < run.steps; ++k) {
    EXPECT_FALSE(out.steps[k].skipped);
    EXPECT_EQ(out.steps[k].loss_scale, 16 << (k / 2)) << "step " << k;
  }
}

TEST(LossScaling, TheUpdateDividesOutTheScaleTheGradientsCarriedNotTheNextOne) {
  // Window 1: the scale doubles after every good step, so each step's gradients carry twice the last one's. A
  // scale that stays put gives the same SGD updates up to the fp16 rounding of the parameters (powers of two
  // scale fp16 gradients exactly in their normal range): at most an ulp or two of each. Dividing by the doubled
  // scale would halve every update, off by far more.
  TrainRun doubling{.world_size = 2, .steps = 3, .lr = 0.5f, .optimizer = sgd_factory()};
  doubling.zero.precision = DType::kF16;
  doubling.zero.loss_scaling.initial_scale = 16;
  doubling.zero.loss_scaling.window = 1;
  TrainRun fixed = doubling;
  fixed.zero.loss_scaling.window = 1000;
  const Outcome a = train(doubling), b = train(fixed);
  ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status << b.status;
  EXPECT_EQ(a.steps[2].loss_scale, 64);
  EXPECT_EQ(b.steps[2].loss_scale, 16);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    const float ulp = std::ldexp(1.0f, std::ilogb(std::max(std::abs(b.params[i]), 6.1e-5f)) - 10);  // fp16's
    EXPECT_LE(std::abs(a.params[i] - b.params[i]), 2 * ulp) << "element " << i;
  }
}

TEST(LossScaling, BfloatAndFloatTrainWithoutScaling) {
  for (DType precision : {DType::kF32, DType::kBF16}) {
    TrainRun run{.world_size = 2, .steps = 2};
    run.zero.precision = precision;
    const Outcome out = train(run);
    ASSERT_TRUE(out.status.ok()) << out.status;
    for (const StepResult& step : out.steps) EXPECT_EQ(step.loss_scale, 1.0) << precision;
  }
}

// --- Accounting (the per-category and per-collective formulas are held to the engine in plan_test) ---

TEST(EngineAccounting, SmallAllreducesCarryOnlyTheStepMetrics) {
  const int n = 4;
  for (int stage = 0; stage <= 3; ++stage) {
    TrainRun run{.world_size = n, .steps = 2};
    run.zero.stage = stage;
    const Outcome out = train(run);
    ASSERT_TRUE(out.status.ok()) << out.status;
    for (const CommVolume& v : out.volume) {
      EXPECT_EQ(v.small, 2 * 4 * (n - 1) / n + 2 * 16 * (n - 1) / n)
          << "stage " << stage << ": an fp32 allreduce of the loss, an int32 one of the two counts in 16-bit halves";
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
  EXPECT_THAT(std::string(refused.status.message()), HasSubstr("Raise the budget, or hold less per rank"));
  // Refused by Engine::create itself, before any step could run.
  const std::vector<absl::Status> created = run_local_ranks(run.world_size, [&](Communicator& comm) {
    Allocator allocator(comm.rank(), run.budget);
    ToyModel model(big);
    return Engine::create(model, comm, allocator, testing::adamw_factory(), run.zero).status();
  });
  for (const absl::Status& status : created) EXPECT_TRUE(is_out_of_memory(status)) << status;
  run.zero.stage = 3;
  run.zero.persistence_threshold = 0;
  const Outcome sharded = train(run);
  ASSERT_TRUE(sharded.status.ok()) << sharded.status;
  EXPECT_LE(sharded.memory[0].peak_total, *run.budget);
}

TEST(EngineAccounting, OffloadedOptimizerTrainsBitIdenticallyWithItsStateInFiles) {
  const testing::ScopedTempDir files;
  const std::string dir = files.path().string();
  for (int stage = 0; stage <= 3; ++stage) {
    TrainRun run{.world_size = 3};
    run.zero.stage = stage;
    run.zero.precision = DType::kBF16;
    run.zero.persistence_threshold = 0;
    const testing::LocalOutcome in_ram = train_local(run);
    run.zero.offload_optimizer_path = dir;
    for (const ZeroConfig::OptimizerSwap& swap : testing::kOptimizerSwapModes) {
      run.zero.optimizer_swap = swap;
      const testing::LocalOutcome offloaded = train_local(run);
      ASSERT_TRUE(in_ram.status.ok() && offloaded.status.ok()) << offloaded.status;
      for (int r = 0; r < 3; ++r) {
        EXPECT_TRUE(bitwise_equal(offloaded.ranks[r].params, in_ram.ranks[r].params))
            << "stage " << stage << ", buffer_count " << swap.buffer_count;
        for (MemoryCategory c : {MemoryCategory::kOptimizerState, MemoryCategory::kMasterWeights}) {
          const int64_t held = in_ram.ranks[r].held_at_end.current_of(c);
          EXPECT_GT(held, 0);
          EXPECT_EQ(offloaded.ranks[r].held_at_end.in_files_of(c), held) << category_name(c) << ", stage " << stage;
          EXPECT_EQ(offloaded.ranks[r].memory.peak_of(c), 0) << category_name(c) << " never in RAM, stage " << stage;
        }
      }
    }
  }
}

TEST(EngineAccounting, PipelinedReadsBringTheNextStepsFirstUnitsInWhileItComputesAndRamHoldsTwoUnitsAtMost) {
  // One rank, bf16 AdamW: each unit's master weights, exp_avg and exp_avg_sq in files, each within one page.
  const testing::ScopedTempDir files;
  if (files_stay_in_ram(files.path().string())) GTEST_SKIP() << files.path().string() << " is in RAM (tmpfs)";
  constexpr int64_t kUnitBytes = 3 * 4096;
  for (const bool pipelined : {false, true}) {
    TrainRun run{.world_size = 1, .steps = 3};
    run.zero.stage = 0;
    run.zero.precision = DType::kBF16;
    run.zero.offload_optimizer_path = files.path().string();
    run.zero.optimizer_swap = {.buffer_count = 6, .pipeline_read = pipelined, .pipeline_write = pipelined};
    int64_t most_in_ram = 0;  // sampled at each unit's start, while the reads ahead and writes behind run
    std::vector<int64_t> before_first_forward;  // per step after the first, once the reads ahead have arrived
    std::string first_forward;
    run.on_unit_start = [&](const std::string& event, const Allocator& allocator) {
      if (first_forward.empty()) first_forward = event;
      most_in_ram = std::max(most_in_ram, allocator.file_bytes_in_ram());
      if (event != first_forward) return;
      // The engine's thread waits here, inside the forward: whatever arrives, the I/O thread brought on its own.
      int64_t in_ram = allocator.file_bytes_in_ram();
      const bool reads_ahead = pipelined && !before_first_forward.empty();  // from the second step
      for (const auto deadline = absl::Now() + absl::Seconds(30); reads_ahead && in_ram < 2 * kUnitBytes;) {
        if (absl::Now() > deadline) break;
        absl::SleepFor(absl::Milliseconds(1));
        in_ram = allocator.file_bytes_in_ram();
      }
      before_first_forward.push_back(in_ram);
    };
    const testing::LocalOutcome out = train_local(run);
    ASSERT_TRUE(out.status.ok()) << out.status;
    ASSERT_EQ(before_first_forward.size(), 3u);
    EXPECT_EQ(before_first_forward[0], 0) << "nothing is read before the first update";
    for (int step = 1; step < 3; ++step) {
      EXPECT_EQ(before_first_forward[step], pipelined ? 2 * kUnitBytes : 0)
          << "step " << step << (pipelined ? ": the first two units' reads ahead" : ": each unit written back at once");
    }
    EXPECT_LE(most_in_ram, 2 * kUnitBytes) << "buffer_count 6 holds two units' three tensors";
  }
}

TEST(EngineAccounting, OffloadedParametersTrainBitIdenticallyWithTheShardsInFiles) {
  // Threshold 150: the two (13, 13) hidden layers (182 elements) are sharded and go to files; the
  // input layer (104) and the head stay whole, in RAM.
  for (DType precision : {DType::kF32, DType::kBF16}) {
    TrainRun run{.world_size = 3};
    run.zero.stage = 3;
    run.zero.precision = precision;
    run.zero.persistence_threshold = 150;
    const testing::LocalOutcome in_ram = train_local(run);
    const testing::ScopedTempDir files;
    run.zero.offload_param_path = files.path().string();
    run.zero.offload_optimizer_path = files.path().string();
    const testing::LocalOutcome offloaded = train_local(run);
    ASSERT_TRUE(in_ram.status.ok() && offloaded.status.ok()) << offloaded.status;
    const int64_t p = static_cast<int64_t>(dtype_size(precision));
    const int64_t shard = (13 * 13 + 13 + 2) / 3;  // a hidden layer padded to 3 ranks, over 3
    for (int r = 0; r < 3; ++r) {
      const std::string where = absl::StrCat(dtype_name(precision), ", rank ", r);
      EXPECT_TRUE(bitwise_equal(offloaded.ranks[r].params, in_ram.ranks[r].params)) << where;
      const MemoryStats& held = offloaded.ranks[r].held_at_end;
      EXPECT_EQ(held.in_files_of(MemoryCategory::kParams), 2 * shard * p) << where;
      EXPECT_EQ(held.current_of(MemoryCategory::kParams) + held.in_files_of(MemoryCategory::kParams),
                in_ram.ranks[r].held_at_end.current_of(MemoryCategory::kParams))
          << where << ": the persistent units stay in RAM";
    }
  }
}

TEST(EngineAccounting, OffloadedShardsAreDroppedFromRamOnceGatheredOrUpdated) {
  TrainRun run{.world_size = 2, .evaluate_first = true};
  run.zero.stage = 3;
  run.zero.persistence_threshold = 0;
  const testing::ScopedTempDir files;
  run.zero.offload_param_path = files.path().string();
  run.zero.offload_optimizer_path = files.path().string();
  if (files_stay_in_ram(files.path().string())) GTEST_SKIP() << files.path().string() << " is in RAM (tmpfs)";
  const testing::LocalOutcome out = train_local(run);
  ASSERT_TRUE(out.status.ok()) << out.status;
  for (const testing::RankResult& rank : out.ranks) {
    EXPECT_GT(rank.held_at_end.in_files_of(MemoryCategory::kParams), 0);
    EXPECT_EQ(rank.file_bytes_in_ram_at_end, 0) << "after the steps, evaluations and the final visit's gathers";
  }
}

TEST(EngineAccounting, EachOffloadFitsABudgetThatTrainingWithoutItDoesNot) {
  // Stage 3 with the parameters and the optimizer in files, then the parameters back in RAM, then the
  // optimizer too: each run fits the budget the run before it needed, and the next one does not.
  const ToyConfig big{.features = 31, .hidden = 301, .hidden_layers = 10};
  TrainRun run{.model = big, .world_size = 2, .steps = 1};
  run.zero.stage = 3;
  run.zero.persistence_threshold = 0;
  const testing::ScopedTempDir files;
  run.zero.offload_param_path = files.path().string();
  run.zero.offload_optimizer_path = files.path().string();
  for (std::string* path : {&run.zero.offload_param_path, &run.zero.offload_optimizer_path}) {
    run.budget.reset();
    const Outcome offloaded = train(run);
    ASSERT_TRUE(offloaded.status.ok()) << offloaded.status;
    run.budget = offloaded.memory[0].peak_total;
    EXPECT_TRUE(train(run).status.ok());
    path->clear();
    EXPECT_TRUE(is_out_of_memory(train(run).status))
        << (path == &run.zero.offload_param_path ? "the parameter shards" : "AdamW's 8 bytes per parameter")
        << " need room in RAM";
  }
}

TEST(EngineConfig, OffloadPathThatCannotHoldFilesIsRefusedNamingIt) {
  TrainRun run{.world_size = 2};
  run.zero.offload_optimizer_path = "/nonexistent/nvme";
  const Outcome out = train(run);
  EXPECT_FALSE(out.status.ok());
  EXPECT_THAT(std::string(out.status.message()), HasSubstr("offloading the optimizer to /nonexistent/nvme"));
}

TEST(EngineConfig, SwapBuffersTooFewForOneUnitOrForAPipelineAreRefusedSayingHowManyItTakes) {
  const testing::ScopedTempDir files;
  const struct {
    ZeroConfig::OptimizerSwap swap;
    std::string says;
  } cases[] = {
      {{.buffer_count = 2},
       "= 2: one unit's update holds 3 optimizer tensors in RAM (master weights, exp_avg, "
       "exp_avg_sq); set buffer_count to at least 3"},
      {{.buffer_count = 5, .pipeline_write = true},
       "and a pipelined read or write one more unit's; set buffer_count "
       "to at least 6"},
  };
  for (const auto& [swap, says] : cases) {
    TrainRun run{.world_size = 2};
    run.zero.precision = DType::kBF16;
    run.zero.offload_optimizer_path = files.path().string();
    run.zero.optimizer_swap = swap;
    const Outcome out = train(run);
    EXPECT_TRUE(absl::IsInvalidArgument(out.status)) << out.status;
    EXPECT_THAT(std::string(out.status.message()), HasSubstr(says));
  }
  EXPECT_THAT(std::string(ZeroConfig{.optimizer_swap = {.buffer_count = 0}}.validate().message()),
              HasSubstr("optimizer_swap.buffer_count = 0: RAM must hold at least one tensor"));
}

TEST(EngineConfig, OffloadedParameterPathThatCannotHoldFilesIsRefusedNamingIt) {
  TrainRun run{.world_size = 2};
  run.zero.stage = 3;
  run.zero.persistence_threshold = 0;
  run.zero.offload_param_path = "/nonexistent/nvme";
  const Outcome out = train(run);
  EXPECT_FALSE(out.status.ok());
  EXPECT_THAT(std::string(out.status.message()), HasSubstr("offloading the parameters to /nonexistent/nvme"));
}

TEST(EngineConfig, OffloadFromAGpuToFilesIsRefusedSayingItIsNotBuilt) {
  for (const ZeroConfig& config : {ZeroConfig{.device = Device::cuda(0), .offload_optimizer_path = "/nvme"},
                                   ZeroConfig{.stage = 3, .device = Device::cuda(0), .offload_param_path = "/nvme"}}) {
    const absl::Status status = config.validate();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("offloading from cuda:0 to files is not built"));
  }
}

TEST(EngineConfig, HostOffloadNeedsAnEngineOnADevice) {
  const ZeroConfig on_gpu{.device = Device::cuda(0), .offload_optimizer_to_host = true};
  EXPECT_TRUE(on_gpu.validate().ok());
  const absl::Status status = ZeroConfig{.offload_optimizer_to_host = true}.validate();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("the engine is on the CPU, where its optimizer runs already"));
}

TEST(EngineConfig, Tf32NeedsACudaDevice) {
  EXPECT_TRUE((ZeroConfig{.device = Device::cuda(0), .tf32 = true}.validate().ok()));
  for (const Device device : {Device::cpu(), Device::sim(0)}) {
    const absl::Status status = ZeroConfig{.device = device, .tf32 = true}.validate();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("TF32 runs on CUDA's tensor cores; " + device.to_string() + " computes fp32 GEMMs exactly"));
  }
}

TEST(EngineConfig, OffloadingParametersBelowStage3IsRefused) {
  const absl::Status status = ZeroConfig{.stage = 2, .offload_param_path = "/nvme"}.validate();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("ZeroConfig.offload_param_path = /nvme: stage 2 keeps every parameter whole"));
}

TEST(EngineConfig, DifferentModelsOnDifferentRanksAreRefusedAtCreate) {
  // Rank 1 builds hidden layers of another width: every later collective would be mis-sized.
  const std::vector<absl::Status> statuses = run_local_ranks(3, [](Communicator& comm) -> absl::Status {
    Allocator allocator(comm.rank());
    ToyModel model(ToyConfig{.hidden = comm.rank() == 1 ? 14 : 13});
    return Engine::create(model, comm, allocator, sgd_factory(), ZeroConfig{}).status();
  });
  for (const absl::Status& s : statuses) {
    EXPECT_THAT(std::string(s.message()), HasSubstr("the model differs across ranks: rank(s) 1 declare")) << s;
  }
}

TEST(EngineConfig, AGpuThatIsNotThereIsRefusedAtCreateSayingWhy) {
  const Device missing = Device::cuda(cuda_device_count());
  const std::vector<absl::Status> statuses = run_local_ranks(1, [&](Communicator& comm) -> absl::Status {
    Allocator allocator(comm.rank());
    ToyModel model(ToyConfig{});
    return Engine::create(model, comm, allocator, sgd_factory(), ZeroConfig{.device = missing}).status();
  });
  EXPECT_EQ(statuses[0], check_cuda_device(missing.index));
  EXPECT_TRUE(absl::IsFailedPrecondition(statuses[0])) << statuses[0];
}

TEST(EngineConfig, BadValuesNameTheKey) {
  ZeroConfig c;
  c.stage = 4;
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("ZeroConfig.stage = 4"));
  c = ZeroConfig{};
  c.accumulation_steps = 0;
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("accumulation_steps = 0"));
  c = ZeroConfig{};
  c.bucket_cap_bytes = 0;
  EXPECT_THAT(std::string(c.validate().message()), HasSubstr("bucket_cap_bytes = 0"));
}

}  // namespace
}  // namespace zero

namespace zero {
namespace {

// A clipping threshold above every norm clips nothing, even one too large for a float coefficient (the optimizers
// refuse an infinite one): the parameters of the run without clipping.
TEST(GradientClipping, AThresholdAboveEveryNormLeavesTheRunUnclipped) {
  for (const DType precision : {DType::kF32, DType::kBF16}) {
    TrainRun run{.world_size = 2};
    run.zero.stage = 2;
    run.zero.precision = precision;
    const Outcome unclipped = train(run);
    ASSERT_TRUE(unclipped.status.ok()) << unclipped.status;
    run.zero.gradient_clipping = 1e39;
    const Outcome clipped = train(run);
    ASSERT_TRUE(clipped.status.ok()) << dtype_name(precision) << ": " << clipped.status;
    EXPECT_EQ(clipped.params, unclipped.params) << dtype_name(precision);
  }
}

TEST(NonFiniteGradients, WithoutLossScalingEveryRankStopsNamingTheFirstUnitWithANaN) {
  // Rank 1 writes a NaN into hidden_1's gradient: fp32 and bf16 have no scaler to skip the step, so the
  // clipped run must stop on every rank, naming the unit, before any rank updates (not call it an overflow).
  for (const DType precision : {DType::kF32, DType::kBF16}) {
    for (const int stage : {0, 3}) {
      TrainRun run{.world_size = 2, .steps = 2};
      run.zero.stage = stage;
      run.zero.persistence_threshold = 0;
      run.zero.precision = precision;
      run.zero.gradient_clipping = 1.0;
      run.hooks.after_backward = [](const UnitContext& ctx, absl::string_view unit, const ParamViews& grads) {
        if (ctx.allocator.rank() != 1 || unit != "hidden_1") return;
        const Tensor& g = grads.at("weight");
        if (g.dtype() == DType::kF32) *static_cast<float*>(g.data()) = std::nanf("");
        if (g.dtype() == DType::kBF16) *static_cast<uint16_t*>(g.data()) = 0x7FC0;  // bf16 NaN
      };
      const testing::LocalOutcome out = train_local(run);
      EXPECT_TRUE(absl::IsAborted(out.status)) << out.status;
      EXPECT_THAT(out.status.message(),
                  AllOf(HasSubstr("step 1: the gradients of unit 'hidden_1' are not finite (NaN or infinity) in "),
                        HasSubstr("no rank updated")))
          << dtype_name(precision) << " stage " << stage;
    }
  }
}

}  // namespace
}  // namespace zero
