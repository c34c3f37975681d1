// Checkpoints: resuming is bitwise identical to not stopping, any layout loads any other's, bad ones are refused.
#include "shard/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "runtime/comm/local.h"
#include "runtime/status.h"
#include "tests/shard/toy_training.h"
#include "tests/temp_dir.h"

namespace zero {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using testing::bitwise_equal;
using ::testing::HasSubstr;
using testing::LocalOutcome;
using testing::train_local;
using testing::TrainRun;

// Trains `run` from step `first` for `steps` steps, loading and saving as given.
LocalOutcome train_span(TrainRun run, int first, int steps, std::string load = "", std::string save = "") {
  run.first_step = first;
  run.steps = steps;
  run.load_checkpoint = std::move(load);
  run.save_checkpoint = std::move(save);
  return train_local(run);
}

TrainRun small_run(int world_size, int stage, DType precision) {
  TrainRun run{.world_size = world_size};
  run.zero.stage = stage;
  run.zero.precision = precision;
  run.zero.persistence_threshold = 0;
  run.zero.gradient_clipping = 1.0;
  run.zero.weight_decay = 0.01f;
  // fp16: a scale that overflows at first, then a window short enough to double it again within the run,
  // so the loss scaler's state matters across the stop.
  run.zero.loss_scaling.initial_scale = std::ldexp(1.0, 30);
  run.zero.loss_scaling.window = 2;
  return run;
}

class Resume : public ::testing::TestWithParam<std::tuple<int, int, DType>> {};

TEST_P(Resume, IsBitwiseIdenticalToNotStopping) {
  const auto [world_size, stage, precision] = GetParam();
  const TrainRun run = small_run(world_size, stage, precision);
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  const LocalOutcome straight = train_span(run, 0, 6);
  const LocalOutcome first_half = train_span(run, 0, 3, "", dir + "/step-3");
  const LocalOutcome second_half = train_span(run, 3, 3, dir + "/step-3");
  ASSERT_TRUE(straight.status.ok()) << straight.status;
  ASSERT_TRUE(first_half.status.ok()) << first_half.status;
  ASSERT_TRUE(second_half.status.ok()) << second_half.status;
  for (int r = 0; r < world_size; ++r) {
    EXPECT_TRUE(bitwise_equal(second_half.ranks[r].params, straight.ranks[r].params)) << "rank " << r;
    for (int k = 0; k < 3; ++k) {
      const StepResult& resumed = second_half.ranks[r].steps[k];
      const StepResult& expected = straight.ranks[r].steps[3 + k];
      EXPECT_EQ(resumed.loss, expected.loss) << "step " << 3 + k;
      EXPECT_EQ(resumed.loss_scale, expected.loss_scale) << "step " << 3 + k;
      EXPECT_EQ(resumed.skipped, expected.skipped) << "step " << 3 + k;
    }
  }
  if (precision == DType::kF16) {  // the scaler did change around the stop, or the test would prove little
    EXPECT_NE(straight.ranks[0].steps[0].loss_scale, straight.ranks[0].steps[5].loss_scale);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizesStagesPrecisions, Resume,
                         ::testing::Combine(::testing::Values(1, 3), ::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16)),
                         [](const auto& info) {
                           return absl::StrCat("N", std::get<0>(info.param), "_stage", std::get<1>(info.param), "_",
                                               dtype_name(std::get<2>(info.param)));
                         });

TEST(Checkpoint, LoadsUnderAnotherWorldSizeStageAndWrapPolicyWithoutChangingABit) {
  // Saved by 2 ranks at stage 1, passed through 3 ranks at stage 3 with merged units (load, save), and
  // back: training on from the round trip equals training on from the original.
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  const TrainRun two = small_run(2, 1, DType::kBF16);
  TrainRun three = small_run(3, 3, DType::kBF16);
  three.zero.wrap_min_params = 150;
  ASSERT_TRUE(train_span(two, 0, 3, "", dir + "/original").status.ok());
  const LocalOutcome through_three = train_span(three, 3, 0, dir + "/original", dir + "/via-three");
  ASSERT_TRUE(through_three.status.ok()) << through_three.status;
  const LocalOutcome from_original = train_span(two, 3, 3, dir + "/original");
  const LocalOutcome from_round_trip = train_span(two, 3, 3, dir + "/via-three");
  ASSERT_TRUE(from_original.status.ok() && from_round_trip.status.ok()) << from_round_trip.status;
  EXPECT_TRUE(bitwise_equal(from_round_trip.ranks[0].params, from_original.ranks[0].params));

  // Stage 0 keeps every value once, in rank 0's file; its other ranks save none.
  const TrainRun ddp = small_run(2, 0, DType::kBF16);
  ASSERT_TRUE(train_span(ddp, 3, 0, dir + "/original", dir + "/via-ddp").status.ok());
  EXPECT_GT(fs::file_size(dir + "/via-ddp/" + checkpoint_file_name(0, 2)),
            4 * fs::file_size(dir + "/via-ddp/" + checkpoint_file_name(1, 2)));
  const LocalOutcome from_ddp = train_span(two, 3, 3, dir + "/via-ddp");
  ASSERT_TRUE(from_ddp.status.ok()) << from_ddp.status;
  EXPECT_TRUE(bitwise_equal(from_ddp.ranks[0].params, from_original.ranks[0].params));
}

TEST(Checkpoint, AnOffloadedEngineSavesAndLoadsAsOneInRam) {
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  const TrainRun in_ram = small_run(2, 3, DType::kBF16);
  const LocalOutcome straight = train_span(in_ram, 0, 4);
  ASSERT_TRUE(train_span(in_ram, 0, 2, "", dir + "/from-ram").status.ok());
  // Synchronous, and pipelined: a save and a load find the next step's first units read ahead.
  for (const ZeroConfig::OptimizerSwap& swap :
       {ZeroConfig::OptimizerSwap{}, {.buffer_count = 6, .pipeline_read = true, .pipeline_write = true}}) {
    TrainRun offloaded = in_ram;
    offloaded.zero.offload_optimizer_path = dir;
    offloaded.zero.offload_param_path = dir;
    offloaded.zero.optimizer_swap = swap;
    const std::string saved = absl::StrCat(dir, "/from-files-", swap.buffer_count);
    ASSERT_TRUE(train_span(offloaded, 0, 2, "", saved).status.ok());
    const LocalOutcome into_ram = train_span(in_ram, 2, 2, saved);
    const LocalOutcome into_files = train_span(offloaded, 2, 2, dir + "/from-ram");
    ASSERT_TRUE(straight.status.ok() && into_ram.status.ok() && into_files.status.ok()) << into_files.status;
    EXPECT_TRUE(bitwise_equal(into_ram.ranks[0].params, straight.ranks[0].params)) << swap.buffer_count;
    EXPECT_TRUE(bitwise_equal(into_files.ranks[0].params, straight.ranks[0].params)) << swap.buffer_count;
  }
}

TEST(Checkpoint, MissingOrIncompleteCheckpointsAreRefusedNamingWhatIsMissing) {
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  const TrainRun run = small_run(3, 2, DType::kF32);
  const LocalOutcome absent = train_span(run, 0, 1, dir + "/never-saved");
  EXPECT_TRUE(absl::IsNotFound(absent.status)) << absent.status;
  EXPECT_THAT(absent.status.message(), HasSubstr("never-saved: no such directory"));

  ASSERT_TRUE(train_span(run, 0, 1, "", dir + "/step-1").status.ok());
  fs::remove(dir + "/step-1/" + checkpoint_file_name(1, 3));
  const LocalOutcome incomplete = train_span(run, 1, 1, dir + "/step-1");
  EXPECT_THAT(incomplete.status.message(), HasSubstr("rank-00001-of-00003.safetensors is missing"));

  std::ofstream(dir + "/step-1/" + checkpoint_file_name(1, 3)) << "not a safetensors file";
  const LocalOutcome corrupt = train_span(run, 1, 1, dir + "/step-1");
  EXPECT_FALSE(corrupt.status.ok());
  EXPECT_THAT(corrupt.status.message(), HasSubstr(checkpoint_file_name(1, 3)));
}

TEST(Checkpoint, AnotherModelOrOptimizerIsRefusedNamingTheParameterOrState) {
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  const TrainRun run = small_run(2, 3, DType::kF32);
  ASSERT_TRUE(train_span(run, 0, 1, "", dir + "/adamw").status.ok());

  TrainRun wider = run;
  wider.model.hidden = 14;
  const LocalOutcome other_model = train_span(wider, 1, 1, dir + "/adamw");
  EXPECT_TRUE(absl::IsInvalidArgument(other_model.status) || absl::IsDataLoss(other_model.status))
      << other_model.status;
  EXPECT_THAT(other_model.status.message(), HasSubstr("saved from another model"));

  TrainRun sgd = run;
  sgd.optimizer = testing::sgd_factory();
  const LocalOutcome other_optimizer = train_span(sgd, 1, 1, dir + "/adamw");
  EXPECT_THAT(other_optimizer.status.message(), HasSubstr("optimizer state 'exp_avg'"));
  EXPECT_THAT(other_optimizer.status.message(), HasSubstr("load it with that optimizer"));
}

TEST(Checkpoint, SavingOverAnEarlierCheckpointReplacesItAndAFailedSaveLeavesNothingBehind) {
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  const TrainRun run = small_run(2, 2, DType::kF32);
  ASSERT_TRUE(train_span(run, 0, 1, "", dir + "/ckpt").status.ok());
  fs::create_directories(dir + "/ckpt.partial/leftover");  // as a save that was killed would leave it
  ASSERT_TRUE(train_span(run, 0, 2, "", dir + "/ckpt").status.ok());
  EXPECT_FALSE(fs::exists(dir + "/ckpt.partial"));
  EXPECT_FALSE(fs::exists(dir + "/ckpt.old"));
  const LocalOutcome straight = train_span(run, 0, 3);
  const LocalOutcome resumed = train_span(run, 2, 1, dir + "/ckpt");
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  EXPECT_TRUE(bitwise_equal(resumed.ranks[1].params, straight.ranks[1].params)) << "the newer save is in place";

  std::ofstream(dir + "/not-a-directory") << "a file";
  const LocalOutcome failed = train_span(run, 0, 1, "", dir + "/not-a-directory/ckpt");
  EXPECT_FALSE(failed.status.ok());
  EXPECT_THAT(failed.status.message(), HasSubstr("not-a-directory/ckpt.partial"));
  for (const char* leftover : {"/not-a-directory/ckpt", "/not-a-directory/ckpt.partial"}) {
    EXPECT_FALSE(fs::exists(dir + leftover)) << leftover;
  }
}

TEST(Checkpoint, CallerMetadataRoundTripsAndTheLatestTagPointsAtTheNewest) {
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  using Metadata = std::map<std::string, std::string>;
  Metadata loaded;
  const std::vector<absl::Status> statuses = run_local_ranks(2, [&](Communicator& comm) -> absl::Status {
    Allocator allocator(comm.rank());
    testing::ToyModel model(testing::ToyConfig{});
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                          Engine::create(model, comm, allocator, testing::adamw_factory(), ZeroConfig{.stage = 3}));
    EXPECT_TRUE(absl::IsInvalidArgument(engine->save_checkpoint(dir + "/bad", {{"zero.steps", "7"}})));
    ZERO_RETURN_IF_ERROR(engine->save_checkpoint(dir + "/step-7", {{"trainer.step", "7"}, {"data.epoch", "1"}}));
    ZERO_ASSIGN_OR_RETURN(Metadata extra, engine->load_checkpoint(dir + "/step-7"));
    if (comm.rank() == 0) loaded = extra;
    return absl::OkStatus();
  });
  ASSERT_TRUE(root_cause(statuses).ok()) << root_cause(statuses);
  EXPECT_EQ(loaded, (Metadata{{"data.epoch", "1"}, {"trainer.step", "7"}}));

  EXPECT_TRUE(absl::IsNotFound(latest_checkpoint(dir).status()));
  ASSERT_TRUE(write_latest_checkpoint_tag(dir, "step-3").ok());
  ASSERT_TRUE(write_latest_checkpoint_tag(dir, "step-7").ok());
  EXPECT_EQ(latest_checkpoint(dir).value_or(""), (fs::path(dir) / "step-7").string());
}

}  // namespace
}  // namespace zero

namespace zero {
namespace {

// --- Integrity: corrupt or mixed files are refused before anything changes -------------------------------

TEST(CheckpointIntegrity, AFlippedBitIsRefusedNamingTheFileAndTheTensor) {
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  const TrainRun run = small_run(3, 2, DType::kF32);
  ASSERT_TRUE(train_span(run, 0, 1, "", dir + "/step-1").status.ok());
  const std::string file = dir + "/step-1/" + checkpoint_file_name(1, 3);
  {
    std::fstream bytes(file, std::ios::in | std::ios::out | std::ios::binary);
    bytes.seekg(-6, std::ios::end);  // inside the last tensor's data
    const char c = static_cast<char>(bytes.get());
    bytes.seekp(-6, std::ios::end);
    bytes.put(static_cast<char>(c ^ 0x10));
  }
  const LocalOutcome flipped = train_span(run, 1, 1, dir + "/step-1");
  EXPECT_TRUE(absl::IsDataLoss(flipped.status)) << flipped.status;
  EXPECT_THAT(flipped.status.message(), AllOf(HasSubstr(checkpoint_file_name(1, 3) + ": tensor '"),
                                              HasSubstr("does not match its checksum"), HasSubstr("corrupt")));
}

TEST(CheckpointIntegrity, RankFilesOfTwoSavesInOneDirectoryAreRefusedEvenWhenEachRankReadsItsOwn) {
  // Saved and loaded with the same layout, each rank reads only its own file: before, rank 1 would have
  // resumed step 2's state beside ranks 0 and 2 at step 1.
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  const TrainRun run = small_run(3, 2, DType::kF32);
  ASSERT_TRUE(train_span(run, 0, 1, "", dir + "/step-1").status.ok());
  ASSERT_TRUE(train_span(run, 1, 1, dir + "/step-1", dir + "/step-2").status.ok());
  ASSERT_TRUE(train_span(run, 0, 1, "", dir + "/again-1").status.ok());  // the same step, another save
  const std::string rank_1 = checkpoint_file_name(1, 3);

  fs::copy_file(dir + "/step-1/" + rank_1, dir + "/step-1-rank-1");
  fs::copy_file(dir + "/step-2/" + rank_1, dir + "/step-1/" + rank_1, fs::copy_options::overwrite_existing);
  const LocalOutcome steps = train_span(run, 1, 1, dir + "/step-1");
  EXPECT_TRUE(absl::IsDataLoss(steps.status)) << steps.status;
  EXPECT_THAT(steps.status.message(), AllOf(HasSubstr("saved by another save than"), HasSubstr("(step 2 against 1)"),
                                            HasSubstr("mixes two checkpoints")));

  fs::copy_file(dir + "/again-1/" + rank_1, dir + "/step-1/" + rank_1, fs::copy_options::overwrite_existing);
  const LocalOutcome saves = train_span(run, 1, 1, dir + "/step-1");
  EXPECT_TRUE(absl::IsDataLoss(saves.status)) << saves.status;
  EXPECT_THAT(saves.status.message(), HasSubstr("(step 1 against 1); the directory mixes two checkpoints"));

  fs::copy_file(dir + "/step-1-rank-1", dir + "/step-1/" + rank_1, fs::copy_options::overwrite_existing);
  EXPECT_TRUE(train_span(run, 1, 1, dir + "/step-1").status.ok()) << "its own files load";
}

}  // namespace
}  // namespace zero
