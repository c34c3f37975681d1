// The NVMe optimizer swapper (shard/offload.h) under an engine: every path between steps with transfers in flight,
// and transfers that fail.
#include <fcntl.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "optim/optimizers.h"
#include "runtime/comm/local.h"
#include "runtime/status.h"
#include "shard/engine.h"
#include "tests/failing_files.h"
#include "tests/shard/toy_training.h"
#include "tests/temp_dir.h"

namespace zero {
namespace {

using testing::bitwise_equal;
using ::testing::HasSubstr;
using testing::kGlobalBatch;
using testing::LocalOutcome;
using testing::ToyData;
using testing::ToyModel;
using testing::train_local;
using testing::TrainRun;

// Everything between steps, with reads ahead in flight: evaluate, a checkpoint saved and loaded back into the same
// engine, the full parameters visited and loaded back. Every stage, every pacing, accumulation, fp16 with skipped
// steps, offload_param at stage 3: bit-identical to the same script in RAM.
TEST(OptimizerSwap, EveryPathBetweenStepsWithReadsAheadInFlightMatchesTrainingInRam) {
  const testing::ScopedTempDir files;
  const std::string dir = files.path().string();
  int combo = 0;
  for (int stage = 0; stage <= 3; ++stage) {
    for (DType precision : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (const ZeroConfig::OptimizerSwap& swap : testing::kOptimizerSwapModes) {
        TrainRun run{.world_size = 3, .steps = 5};
        run.evaluate_first = true;
        run.zero.stage = stage;
        run.zero.precision = precision;
        run.zero.persistence_threshold = 0;
        run.zero.accumulation_steps = 2;
        run.zero.gradient_clipping = 1.0;
        run.zero.loss_scaling.initial_scale = std::ldexp(1.0, 30);  // fp16: the first steps are skipped
        run.zero.loss_scaling.window = 2;
        const std::string ckpt = absl::StrCat(dir, "/ckpt-", combo++);
        run.after_step = [&](Engine& engine, int step) -> absl::Status {
          if (step == 1) {
            ZERO_RETURN_IF_ERROR(engine.save_checkpoint(ckpt));
            ZERO_RETURN_IF_ERROR(engine.load_checkpoint(ckpt).status());
          }
          if (step == 2) {
            ZERO_ASSIGN_OR_RETURN(std::vector<float> all, testing::full_params(engine));
            size_t k = 0;
            ZERO_RETURN_IF_ERROR(engine.load_params([&](absl::string_view, absl::string_view, Tensor dst) {
              for (int64_t i = 0; i < dst.numel(); ++i) dst.data_as<float>()[i] = all[k++];
              return absl::OkStatus();
            }));
          }
          return absl::OkStatus();
        };
        const LocalOutcome in_ram = train_local(run);
        run.zero.offload_optimizer_path = dir;
        run.zero.optimizer_swap = swap;
        if (stage == 3) run.zero.offload_param_path = dir;
        const LocalOutcome offloaded = train_local(run);
        const std::string where =
            absl::StrCat("stage ", stage, " ", dtype_name(precision), " buffer_count ", swap.buffer_count, " read ",
                         swap.pipeline_read, " write ", swap.pipeline_write);
        ASSERT_TRUE(in_ram.status.ok()) << where << ": " << in_ram.status;
        ASSERT_TRUE(offloaded.status.ok()) << where << ": " << offloaded.status;
        for (int r = 0; r < 3; ++r) {
          EXPECT_TRUE(bitwise_equal(offloaded.ranks[r].params, in_ram.ranks[r].params)) << where << ", rank " << r;
        }
      }
    }
  }
}

// A checkpoint reads the offloaded state and writes none of it back: it saves while the files refuse writes. (One
// rank: the files are the process's, which other ranks' threads would be writing meanwhile.)
TEST(OptimizerSwap, ACheckpointReadsTheOffloadedStateAndWritesNothingBack) {
  const testing::ScopedTempDir files;
  const std::string dir = files.path().string();
  TrainRun run{.world_size = 1, .steps = 2};
  run.zero.stage = 3;
  run.zero.precision = DType::kBF16;
  run.zero.persistence_threshold = 0;
  run.zero.offload_optimizer_path = dir;
  run.zero.offload_param_path = dir;
  run.zero.optimizer_swap = {.buffer_count = 6, .pipeline_read = true, .pipeline_write = true};
  run.after_step = [&](Engine& engine, int step) -> absl::Status {
    if (step != 0) return absl::OkStatus();
    ZERO_RETURN_IF_ERROR(engine.save_checkpoint(absl::StrCat(dir, "/settled")));  // the writes behind are done
    const testing::FailingFiles read_only(testing::offload_fds(dir), O_RDONLY);
    return engine.save_checkpoint(absl::StrCat(dir, "/read-only"));
  };
  const LocalOutcome out = train_local(run);
  EXPECT_TRUE(out.status.ok()) << out.status;
}

// LAMB on slices pages each unit in twice a step, for its first pass (measure_norms) and for its update.
TEST(OptimizerSwap, LambOnSlicesMatchesTrainingInRam) {
  const testing::ScopedTempDir files;
  for (int stage = 1; stage <= 3; ++stage) {
    TrainRun run{.world_size = 2};
    run.zero.stage = stage;
    run.zero.precision = DType::kBF16;
    run.zero.persistence_threshold = 0;
    run.optimizer = [](ShardLayout layout, Allocator& allocator, Device device) {
      return make_lamb(LambOptions{}, std::move(layout), allocator, device);
    };
    const LocalOutcome in_ram = train_local(run);
    run.zero.offload_optimizer_path = files.path().string();
    run.zero.optimizer_swap = {.buffer_count = 6, .pipeline_read = true, .pipeline_write = true};
    const LocalOutcome offloaded = train_local(run);
    ASSERT_TRUE(in_ram.status.ok() && offloaded.status.ok()) << offloaded.status;
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(bitwise_equal(offloaded.ranks[r].params, in_ram.ranks[r].params)) << stage;
  }
}

// One rank, stage 0, bf16 AdamW: each unit's master weights, exp_avg and exp_avg_sq in files, in that order.
TrainRun one_rank_offloaded(const std::string& dir, ZeroConfig::OptimizerSwap swap) {
  TrainRun run{.world_size = 1, .steps = 3};
  run.zero.stage = 0;
  run.zero.precision = DType::kBF16;
  run.zero.offload_optimizer_path = dir;
  run.zero.optimizer_swap = swap;
  return run;
}

TEST(OptimizerSwap, AFailedReadIsReportedNamingTheUnitAndTheRetriedStepReadsItAgain) {
  const testing::ScopedTempDir files;
  const std::string dir = files.path().string();
  const TrainRun run = one_rank_offloaded(dir, {});
  const std::vector<absl::Status> statuses = run_local_ranks(1, [&](Communicator& comm) -> absl::Status {
    Allocator alloc(comm.rank());
    ToyModel model(run.model, comm.rank());
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(model, comm, alloc, run.optimizer, run.zero));
    ToyData data = testing::toy_rows(run.model, 0, kGlobalBatch);
    const Batch batch = data.batch(run.model.features);
    ZERO_RETURN_IF_ERROR(engine->train_step({&batch, 1}, run.lr).status());
    absl::Status failed;
    {
      const testing::FailingFiles unreadable({testing::offload_fds(dir).front()}, O_WRONLY);  // unit 0's master
      failed = engine->train_step({&batch, 1}, run.lr).status();
    }
    EXPECT_THAT(std::string(failed.message()), HasSubstr("reading the optimizer state of unit '"));
    EXPECT_THAT(std::string(failed.message()), HasSubstr("cannot read an offload file"));
    // The drive is back: the retried update reads unit 0 again instead of touching it unread (a crash).
    ZERO_ASSIGN_OR_RETURN(const StepResult retried, engine->step(run.lr));
    EXPECT_TRUE(std::isfinite(retried.loss));
    return absl::OkStatus();
  });
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
}

TEST(OptimizerSwap, AFailedWriteIsReportedNamingTheUnitByTheStepOrPastTheLastCallByTheLog) {
  // The last unit's files refuse writes during the second step. Waited for (no pipeline_write), the failure is
  // that step's; written behind, it reaches a later call or, past the last one, the log. It is never silent.
  for (const bool behind : {false, true}) {
    const testing::ScopedTempDir files;
    const std::string dir = files.path().string();
    const TrainRun run = one_rank_offloaded(dir, {.buffer_count = 6, .pipeline_read = true, .pipeline_write = behind});
    std::vector<absl::Status> failures;
    ::testing::internal::CaptureStderr();
    const std::vector<absl::Status> statuses = run_local_ranks(1, [&](Communicator& comm) -> absl::Status {
      Allocator alloc(comm.rank());
      std::optional<testing::FailingFiles> unwritable;  // until the engine is gone, with its writes behind
      ToyModel model(run.model, comm.rank());
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                            Engine::create(model, comm, alloc, run.optimizer, run.zero));
      ToyData data = testing::toy_rows(run.model, 0, kGlobalBatch);
      const Batch batch = data.batch(run.model.features);
      ZERO_RETURN_IF_ERROR(engine->train_step({&batch, 1}, run.lr).status());
      const std::vector<int> fds = testing::offload_fds(dir);
      unwritable.emplace(std::vector<int>(fds.end() - 3, fds.end()), O_RDONLY);
      failures.push_back(engine->train_step({&batch, 1}, run.lr).status());
      engine.reset();  // logs what no call reported
      return absl::OkStatus();
    });
    const std::string log = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(statuses[0].ok()) << statuses[0];
    ASSERT_EQ(failures.size(), 1u);
    const std::string reported = failures[0].ok() ? log : std::string(failures[0].message());
    EXPECT_THAT(reported, HasSubstr("writing the optimizer state of unit 'head")) << "behind: " << behind;
    EXPECT_THAT(reported, HasSubstr("cannot write an offload file"));
    if (!behind) {
      EXPECT_FALSE(failures[0].ok()) << "a write waited for fails its own step";
    }
  }
}

}  // namespace
}  // namespace zero
