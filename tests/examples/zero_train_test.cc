// zero-train run end to end: a few stage-3 steps on 2 ranks write parseable metrics with a falling loss; bad keys exit
// non-zero.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "runtime/device.h"
#include "runtime/safetensors.h"
#include "tests/examples/run_program.h"
#include "tests/skip_without_gpu.h"
#include "tests/temp_dir.h"

namespace zero::train {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using json = nlohmann::json;

using testing::mpiexec_launcher;
using testing::RunResult;

RunResult run_zero_train(const std::string& args, const std::string& launcher = "") {
  return testing::run_program(ZERO_TRAIN_BINARY, args, launcher);
}

// Every line of the metrics file as JSON; a line that does not parse fails the test.
std::vector<json> metrics_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> records;
  for (std::string line; std::getline(in, line);) {
    json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(record.is_discarded()) << "not JSON: " << line;
    records.push_back(std::move(record));
  }
  return records;
}

std::vector<json> events(const std::vector<json>& records, const std::string& event) {
  std::vector<json> out;
  for (const json& r : records) {
    if (r.value("event", "") == event) out.push_back(r);
  }
  return out;
}

// One block, C = 32, 12 steps of 16 sequences (micro-batch 4, accumulation 2 on 2 ranks), every unit sharded.
std::string tiny_run_args(const std::string& metrics_path) {
  return absl::StrCat(
      "--ranks 2 --zero_optimization.stage=3 --zero_optimization.stage3_param_persistence_threshold=0 "
      "--model.num_layers=1 --model.channels=32 --train_batch_size=16 --train_micro_batch_size_per_gpu=4 "
      "--steps=12 --eval_interval=6 --eval_batches=2 --scheduler.params.warmup_num_steps=2 "
      "--data.addition.val_rows=64 --metrics_path=",
      metrics_path);
}

class ZeroTrainTest : public ::testing::Test {
 protected:
  std::string metrics_path() const { return dir_.file("metrics.jsonl"); }

  const testing::ScopedTempDir dir_;  // the test's metrics, exports and checkpoints
};

TEST_F(ZeroTrainTest, Stage3OnTwoRanksWritesMetricsAndTheLossFalls) {
  const std::string path = metrics_path();
  const RunResult run = run_zero_train(tiny_run_args(path));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, AllOf(HasSubstr("ZeRO stage 3"), HasSubstr("eval step 12"), HasSubstr("ZeRO formula")));

  const std::vector<json> records = metrics_lines(path);
  const std::vector<json> train = events(records, "train");
  ASSERT_EQ(train.size(), 12u);
  for (size_t i = 0; i < train.size(); ++i) EXPECT_EQ(train[i]["step"], i + 1);
  EXPECT_LT(train.back()["loss"].get<double>(), train.front()["loss"].get<double>());
  EXPECT_EQ(events(records, "eval").size(), 2u);  // steps 6 and 12

  // With every unit sharded and fp32 AdamW, the measured model states are exactly the formula's 4+4+8 bytes
  // per parameter over N.
  const std::vector<json> summary = events(records, "summary");
  ASSERT_EQ(summary.size(), 1u);
  EXPECT_EQ(summary[0]["run"], json::parse(R"({"stage": 3, "world_size": 2, "accumulation_steps": 2,
      "precision": "fp32", "tf32": false, "device": "cpu", "backend": "local"})"));  // what the figures are of
  const json& formula = summary[0]["formula_bytes"];
  ASSERT_EQ(summary[0]["peak_bytes"].size(), 2u);
  for (const json& rank : summary[0]["peak_bytes"]) {
    EXPECT_EQ(rank["params"], formula["params"]);
    EXPECT_EQ(rank["grads"], formula["grads"]);
    EXPECT_EQ(rank["optimizer_state"], formula["optimizer_state"]);
  }
  // The reduce-scatters move exactly theory's bytes: one per unit per micro-batch.
  EXPECT_EQ(summary[0]["sent_bytes_per_step"]["grad_reduce"], summary[0]["theory_bytes_per_step"]["grad_reduce"]);
  EXPECT_TRUE(summary[0]["phase_ms_per_step"].empty());  // timed only with wall_clock_breakdown
}

TEST_F(ZeroTrainTest, TheEmbeddedDefaultRunsEightSteps) {
  const RunResult run =
      run_zero_train(absl::StrCat("--steps=8 --eval_interval=0 --eval_batches=1 --data.addition.val_rows=64 "
                                  "--metrics_path=",
                                  metrics_path()));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(events(metrics_lines(metrics_path()), "train").size(), 8u);
}

TEST_F(ZeroTrainTest, TheHuggingFaceTrainersZero3ConfigTrainsWithItsAutosFilledAndCpuOffloadRemoved) {
  const RunResult run = run_zero_train(
      absl::StrCat("--config " ZERO_FIXTURES_DIR
                   "/deepspeed_configs/hf_trainer_zero3.json --zero_optimization.offload_optimizer=null "
                   "--zero_optimization.offload_param=null --ranks 2 --steps=4 --eval_interval=0 --eval_batches=1 "
                   "--data.addition.val_rows=64 --metrics_path=",
                   metrics_path()));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("ZeRO stage 3, fp32"));
  EXPECT_EQ(events(metrics_lines(metrics_path()), "train").size(), 4u);
}

TEST_F(ZeroTrainTest, WallClockBreakdownReportsEveryRanksPhases) {
  const std::string path = metrics_path();
  const RunResult run = run_zero_train(absl::StrCat(tiny_run_args(path), " --wall_clock_breakdown=true"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("time per step by phase"));
  const std::vector<json> summary = events(metrics_lines(path), "summary");
  ASSERT_EQ(summary.size(), 1u);
  const json& phases = summary[0]["phase_ms_per_step"];
  ASSERT_EQ(phases.size(), 2u);
  for (const json& rank : phases) {
    EXPECT_GT(rank["forward"].get<double>(), 0);
    EXPECT_GT(rank["backward"].get<double>(), 0);
    EXPECT_GT(rank["update"].get<double>(), 0);
    EXPECT_LE(rank["waiting"].get<double>(),
              rank["forward"].get<double>() + rank["backward"].get<double>() + rank["update"].get<double>());
  }
  // Rank 0's phases lie within its steps, which also load the batches: both are means over all its steps.
  EXPECT_LE(
      phases[0]["forward"].get<double>() + phases[0]["backward"].get<double>() + phases[0]["update"].get<double>(),
      summary[0]["mean_step_ms"].get<double>());
}

TEST_F(ZeroTrainTest, RecomputingBlocksLowersTheActivationPeakAndNotTheTraining) {
  // Two blocks: recomputed, each holds only its output between forward and backward (models/gpt2.h),
  // and the same parameters train to the same losses.
  std::vector<std::vector<json>> train, summary;
  for (const std::string recompute : {"false", "true"}) {
    const std::string path = dir_.file(absl::StrCat("recompute_", recompute, ".jsonl"));
    const RunResult run = run_zero_train(
        absl::StrCat(tiny_run_args(path), " --model.num_layers=2 --eval_interval=0", " --model.recompute=", recompute));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const std::vector<json> records = metrics_lines(path);
    train.push_back(events(records, "train"));
    summary.push_back(events(records, "summary"));
    ASSERT_EQ(summary.back().size(), 1u);
  }
  EXPECT_EQ(train[1].back()["loss"], train[0].back()["loss"]);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_LT(summary[1][0]["peak_bytes"][r]["activations"].get<int64_t>(),
              summary[0][0]["peak_bytes"][r]["activations"].get<int64_t>())
        << "rank " << r;
  }
}

// The MLP [16, 32, 4] on 4 blobs at stage 2: 20 steps of 32 points (micro-batch 8, accumulation 2 on 2 ranks).
TEST_F(ZeroTrainTest, MlpOnBlobsAtStage2LearnsAboveChance) {
  const std::string path = metrics_path();
  const RunResult run = run_zero_train(absl::StrCat(
      "--ranks 2 --zero_optimization.stage=2 --model.type=mlp --model.widths=[16,32,4] --data.source=blobs "
      "--train_batch_size=32 --train_micro_batch_size_per_gpu=8 --steps=20 --eval_interval=10 --eval_batches=4 "
      "--scheduler.params.warmup_num_steps=2 --data.blobs.val_rows=64 --metrics_path=",
      path));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output,
              AllOf(HasSubstr("MLP widths [16, 32, 4]"), HasSubstr("ZeRO stage 2"), HasSubstr("eval step 20: val loss"),
                    HasSubstr("class accuracy"), HasSubstr("samples/s")));

  const std::vector<json> records = metrics_lines(path);
  const std::vector<json> train = events(records, "train");
  ASSERT_EQ(train.size(), 20u);
  EXPECT_LT(train.back()["loss"].get<double>(), train.front()["loss"].get<double>());
  const std::vector<json> eval = events(records, "eval");
  ASSERT_EQ(eval.size(), 2u);                                 // steps 10 and 20
  EXPECT_GT(eval.back()["val_accuracy"].get<double>(), 0.5);  // chance is 1 in 4
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_F(ZeroTrainTest, ResumingFromACheckpointExportsTheSameBitsAsNotStopping) {
  const std::filesystem::path& dir = dir_.path();
  const std::string ckpt = (dir / "ckpt").string();
  const auto run = [&](const std::string& name, const std::string& more) {
    return run_zero_train(absl::StrCat(tiny_run_args((dir / (name + ".jsonl")).string()),
                                       " --export_path=", (dir / (name + ".safetensors")).string(), " ", more));
  };
  const RunResult straight = run("straight", "");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const RunResult saving = run("saving", absl::StrCat("--checkpoint.dir=", ckpt, " --checkpoint.interval=4"));
  ASSERT_EQ(saving.exit_code, 0) << saving.output;
  // Saved at steps 4, 8 and 12; keep_last 2 removed step 4, and latest names step 12.
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/step-00000004"));
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step-00000008"));
  EXPECT_EQ(file_bytes(ckpt + "/latest"), "step-00000012\n");

  const RunResult resumed = run("resumed", absl::StrCat("--checkpoint.resume=", ckpt, "/step-00000008"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resumed after step 8"));
  const std::vector<json> train = events(metrics_lines((dir / "resumed.jsonl").string()), "train");
  ASSERT_EQ(train.size(), 4u);
  EXPECT_EQ(train.front()["step"], 9);
  const std::string exported = file_bytes((dir / "straight.safetensors").string());
  ASSERT_FALSE(exported.empty());
  EXPECT_TRUE(file_bytes((dir / "saving.safetensors").string()) == exported) << "saving changed the training";
  EXPECT_TRUE(file_bytes((dir / "resumed.safetensors").string()) == exported) << "the resumed run diverged";

  // One rank at stage 0 with nothing left to train consolidates the 2-rank stage-3 checkpoint of step 12
  // into full weights (DeepSpeed's zero_to_fp32): the same bytes the 2-rank run exported.
  const RunResult consolidated = run("consolidated", absl::StrCat("--ranks 1 --zero_optimization.stage=0 ",
                                                                  "--checkpoint.resume=", ckpt, "/step-00000012"));
  ASSERT_EQ(consolidated.exit_code, 0) << consolidated.output;
  EXPECT_THAT(consolidated.output, HasSubstr("nothing is left to train"));
  EXPECT_TRUE(file_bytes((dir / "consolidated.safetensors").string()) == exported);

  const RunResult other_model =
      run("other", absl::StrCat("--model.channels=64 --checkpoint.resume=", ckpt, "/step-00000008"));
  EXPECT_NE(other_model.exit_code, 0);
  EXPECT_THAT(other_model.output, HasSubstr("was it saved from another model?"));
}

TEST_F(ZeroTrainTest, AKillDuringAnOffloadedStepLosesNothingTheLastCheckpointHolds) {
  // Stage 3 with the optimizer (pipelined) and the parameter shards in files, saving every 10 steps: killed once
  // step 20's checkpoint is complete, then resumed from the newest complete one, it exports the bits of a run that
  // never stopped.
  const std::filesystem::path& dir = dir_.path();
  const std::string nvme = (dir / "nvme").string(), ckpt = (dir / "ckpt").string();
  std::filesystem::create_directories(nvme);
  const auto args = [&](const std::string& name, const std::string& more) {
    return absl::StrCat(
        "--ranks 2 --zero_optimization.stage=3 --zero_optimization.stage3_param_persistence_threshold=0 "
        "--model.num_layers=1 --model.channels=32 --train_batch_size=16 --train_micro_batch_size_per_gpu=4 "
        "--steps=300 --eval_interval=0 --scheduler.params.warmup_num_steps=2 --data.addition.val_rows=64 "
        "--zero_optimization.offload_optimizer.device=nvme --zero_optimization.offload_optimizer.nvme_path=",
        nvme, " --zero_optimization.offload_param.device=nvme --zero_optimization.offload_param.nvme_path=", nvme,
        " --zero_optimization.offload_optimizer.buffer_count=8 --zero_optimization.offload_optimizer.pipeline_read=true"
        " --zero_optimization.offload_optimizer.pipeline_write=true --metrics_path=",
        (dir / (name + ".jsonl")).string(), " --export_path=", (dir / (name + ".safetensors")).string(), " ", more);
  };
  const RunResult straight = run_zero_train(args("straight", ""));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string saving = absl::StrCat("--checkpoint.dir=", ckpt, " --checkpoint.interval=10");
  const RunResult killed = testing::run_program_killed_when(ZERO_TRAIN_BINARY, args("killed", saving),
                                                            absl::StrCat("grep -qs step-00000020 ", ckpt, "/latest"));
  ASSERT_EQ(killed.exit_code, 137) << "the run ended before the kill:\n" << killed.output;
  EXPECT_TRUE(std::filesystem::is_empty(nvme)) << "the offload files are unlinked from the start";
  const RunResult resumed = run_zero_train(args("resumed", saving + " --checkpoint.resume=auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resumed after step "));
  const std::string exported = file_bytes((dir / "straight.safetensors").string());
  ASSERT_FALSE(exported.empty());
  EXPECT_TRUE(file_bytes((dir / "resumed.safetensors").string()) == exported) << "the resumed run diverged";
}

// The GPU path on the simulated device runs the CPU's kernels, so it gives the CPU's bits: the same losses, the
// same exported weights, and a checkpoint saved there resumes to them, also with its streams delayed at random. With
// the optimizer offloaded to the host (ZeRO-Offload) the bits are the same, and its checkpoints resume on the device.
TEST_F(ZeroTrainTest, TheSimulatedDeviceTrainsTheCpusBitsAndResumesFromItsCheckpoints) {
  const std::filesystem::path& dir = dir_.path();
  const auto run = [&](const std::string& name, const std::string& more, const std::string& launcher = "") {
    return run_zero_train(absl::StrCat(tiny_run_args((dir / (name + ".jsonl")).string()),
                                       " --export_path=", (dir / (name + ".safetensors")).string(), " ", more),
                          launcher);
  };
  const auto losses = [&](const std::string& name) {
    std::vector<double> out;
    for (const json& r : events(metrics_lines((dir / (name + ".jsonl")).string()), "train")) {
      out.push_back(r["loss"].get<double>());
    }
    return out;
  };
  const std::string ckpt = (dir / "ckpt").string();
  ASSERT_EQ(run("cpu", "").exit_code, 0);
  const RunResult sim = run("sim", absl::StrCat("--device=sim --checkpoint.dir=", ckpt, " --checkpoint.interval=4"));
  ASSERT_EQ(sim.exit_code, 0) << sim.output;
  EXPECT_THAT(sim.output, HasSubstr("on sim:0"));
  EXPECT_EQ(losses("sim"), losses("cpu"));
  const std::string exported = file_bytes((dir / "cpu.safetensors").string());
  ASSERT_FALSE(exported.empty());
  EXPECT_TRUE(file_bytes((dir / "sim.safetensors").string()) == exported);
  const RunResult resumed = run("resumed", absl::StrCat("--device=sim --checkpoint.resume=", ckpt, "/step-00000008"),
                                "ZERO_SIM_DELAY_US=100 ZERO_SIM_SEED=3");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(file_bytes((dir / "resumed.safetensors").string()) == exported);

  const std::string offload = "--device=sim --zero_optimization.offload_optimizer.device=cpu";
  const std::string offload_ckpt = (dir / "offload_ckpt").string();
  const RunResult offloaded =
      run("offloaded", absl::StrCat(offload, " --checkpoint.dir=", offload_ckpt, " --checkpoint.interval=4"));
  ASSERT_EQ(offloaded.exit_code, 0) << offloaded.output;
  EXPECT_THAT(offloaded.output, HasSubstr("optimizer (fp32 master weights and state) to host memory"));
  EXPECT_EQ(losses("offloaded"), losses("cpu"));
  EXPECT_TRUE(file_bytes((dir / "offloaded.safetensors").string()) == exported);
  const RunResult back_on_device =
      run("back_on_device", absl::StrCat("--device=sim --checkpoint.resume=", offload_ckpt, "/step-00000008"));
  ASSERT_EQ(back_on_device.exit_code, 0) << back_on_device.output;
  EXPECT_TRUE(file_bytes((dir / "back_on_device.safetensors").string()) == exported);
  const RunResult offloaded_again =
      run("offloaded_again", absl::StrCat(offload, " --checkpoint.resume=", ckpt, "/step-00000008"));
  ASSERT_EQ(offloaded_again.exit_code, 0) << offloaded_again.output;
  EXPECT_TRUE(file_bytes((dir / "offloaded_again.safetensors").string()) == exported);
  // The parameter shards in host memory too (stage 3): the same bits again.
  const RunResult shards_offloaded =
      run("shards_offloaded", absl::StrCat(offload, " --zero_optimization.offload_param.device=cpu"));
  ASSERT_EQ(shards_offloaded.exit_code, 0) << shards_offloaded.output;
  EXPECT_THAT(shards_offloaded.output, HasSubstr("and parameter shards to host memory"));
  EXPECT_EQ(losses("shards_offloaded"), losses("cpu"));
  EXPECT_TRUE(file_bytes((dir / "shards_offloaded.safetensors").string()) == exported);
}

// ZeRO-Offload's delayed parameter update through zero-train: the warm-up's losses are the immediate update's, the
// next step's loss is not (its gradient is taken one update late), and a checkpoint saved with an update in flight
// resumes to the same exported weights.
TEST_F(ZeroTrainTest, TheDelayedUpdateResumesFromItsCheckpointsToTheSameWeights) {
  const std::filesystem::path& dir = dir_.path();
  const std::string offload = "--device=sim --zero_optimization.offload_optimizer.device=cpu";
  const std::string delayed = offload + " --zero_optimization.delayed_update_after=2";
  const std::string ckpt = (dir / "ckpt").string();
  const auto run = [&](const std::string& name, const std::string& more) {
    return run_zero_train(absl::StrCat(tiny_run_args((dir / (name + ".jsonl")).string()),
                                       " --export_path=", (dir / (name + ".safetensors")).string(), " ", more));
  };
  const auto losses = [&](const std::string& name) {
    std::vector<double> out;
    for (const json& r : events(metrics_lines((dir / (name + ".jsonl")).string()), "train")) {
      out.push_back(r["loss"].get<double>());
    }
    return out;
  };
  ASSERT_EQ(run("immediate", offload).exit_code, 0);
  const RunResult through =
      run("delayed", absl::StrCat(delayed, " --checkpoint.dir=", ckpt, " --checkpoint.interval=4"));
  ASSERT_EQ(through.exit_code, 0) << through.output;
  EXPECT_THAT(through.output, HasSubstr("delayed one step after step 2"));
  const std::vector<double> immediate = losses("immediate"), late = losses("delayed");
  ASSERT_EQ(late.size(), immediate.size());
  ASSERT_GE(late.size(), 4u);
  EXPECT_EQ(std::vector<double>(late.begin(), late.begin() + 3),
            std::vector<double>(immediate.begin(), immediate.begin() + 3));
  EXPECT_NE(late[3], immediate[3]);
  const RunResult resumed = run("resumed", absl::StrCat(delayed, " --checkpoint.resume=", ckpt, "/step-00000008"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::string exported = file_bytes((dir / "delayed.safetensors").string());
  ASSERT_FALSE(exported.empty());
  EXPECT_TRUE(file_bytes((dir / "resumed.safetensors").string()) == exported);
}

// --- Nothing saved is lost ------------------------------------------------------------------------------

// Every file under `dir`, by relative path, with its bytes.
std::map<std::string, std::string> files_under(const std::filesystem::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[entry.path().lexically_relative(dir).string()] = file_bytes(entry.path());
  }
  return files;
}

TEST_F(ZeroTrainTest, ARerunBesideLaterCheckpointsIsRefusedAndChangesNothing) {
  // Rerunning the same command without checkpoint.resume would save steps 4, 8, 12 again, and before,
  // pruning by step number deleted them as "older" than what was there, leaving latest naming nothing.
  const std::string ckpt = dir_.file("ckpt");
  const std::string args =
      absl::StrCat(tiny_run_args(""), " --checkpoint.dir=", ckpt, " --checkpoint.interval=4 --checkpoint.keep_last=2");
  const RunResult first = run_zero_train(args);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::map<std::string, std::string> saved = files_under(ckpt);
  ASSERT_EQ(saved.at("latest"), "step-00000012\n");

  const RunResult again = run_zero_train(args);
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_THAT(again.output, AllOf(HasSubstr("checkpoint.dir = " + ckpt + " holds step-00000012, later than step 0"),
                                  HasSubstr("checkpoint.resume=auto")));
  EXPECT_TRUE(files_under(ckpt) == saved) << "the refused run changed the checkpoints";

  const RunResult resumed = run_zero_train(absl::StrCat(args, " --checkpoint.resume=auto --steps=16"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resumed after step 12"));
  EXPECT_EQ(file_bytes(ckpt + "/latest"), "step-00000016\n");
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step-00000012")) << "keep_last 2 keeps the two newest";
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/step-00000008"));
}

TEST_F(ZeroTrainTest, ResumeAutoWithoutLatestTakesTheNewestCompleteCheckpoint) {
  const std::string ckpt = dir_.file("ckpt");
  const std::string args =
      absl::StrCat(tiny_run_args(""), " --checkpoint.dir=", ckpt, " --checkpoint.interval=4 --checkpoint.keep_last=0");
  const RunResult first = run_zero_train(args);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // As if the run died between writing step 12's files: latest is gone and step 12 lacks rank 1's file.
  std::filesystem::remove(ckpt + "/latest");
  std::filesystem::remove(ckpt + "/step-00000012/rank-00001-of-00002.safetensors");
  std::filesystem::create_directory(ckpt + "/step-00000016.partial");  // and a save that never finished

  const RunResult resumed = run_zero_train(absl::StrCat(args, " --checkpoint.resume=auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resumed after step 8"));
  EXPECT_EQ(file_bytes(ckpt + "/latest"), "step-00000012\n");
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step-00000012/rank-00001-of-00002.safetensors")) << "saved again";
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/step-00000016.partial")) << "the next save removes what saves left";
}

TEST_F(ZeroTrainTest, CorruptRunMetadataInACheckpointIsRefusedNamingTheKey) {
  const std::string ckpt = dir_.file("ckpt");
  const std::string args = absl::StrCat(tiny_run_args(""), " --checkpoint.dir=", ckpt, " --checkpoint.interval=6");
  ASSERT_EQ(run_zero_train(args).exit_code, 0);
  for (int rank = 0; rank < 2; ++rank) {  // train.world_size = -2 in every rank file of step 6
    const std::string path = absl::StrCat(ckpt, "/step-00000006/rank-0000", rank, "-of-00002.safetensors");
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(path);
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const SafetensorsEntry& entry : file->entries()) tensors.emplace_back(entry.name, *file->get(entry.name));
    std::map<std::string, std::string> metadata = file->metadata();
    metadata["train.world_size"] = "-2";
    ASSERT_TRUE(write_safetensors(path, tensors, metadata).ok());
  }
  const RunResult resumed =
      run_zero_train(absl::StrCat(tiny_run_args(""), " --checkpoint.resume=", ckpt, "/step-00000006"));
  EXPECT_EQ(resumed.exit_code, 2) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("train.world_size = -2 is below 1; its metadata is corrupt"));
}

TEST_F(ZeroTrainTest, AMetricsFileThatCannotBeWrittenEndsTheRunWithTheReason) {
  const RunResult run = run_zero_train(absl::StrCat(tiny_run_args("/dev/full")));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("zero-train: metrics_path = /dev/full: cannot write it: No space left on device"));
}

TEST_F(ZeroTrainTest, AnExportTheOsRefusesLeavesThePreviousExportWhole) {
  const std::string path = dir_.file("model.safetensors");
  const std::string args = absl::StrCat(tiny_run_args(""), " --steps=3 --eval_interval=0 --export_path=", path);
  const RunResult first = run_zero_train(args);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string previous = file_bytes(path);
  ASSERT_GT(previous.size(), 8192u);
  // The OS refuses writes past RLIMIT_FSIZE mid-file, as a full disk does (the signal it also sends is
  // ignored, as it is for a full disk).
  const RunResult refused = run_zero_train(args, "trap '' XFSZ; prlimit --fsize=8192");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr(absl::StrCat("cannot write ", path, ": File too large")));
  EXPECT_TRUE(file_bytes(path) == previous) << "the failed export changed the previous one";
  EXPECT_EQ(files_under(dir_.path()).size(), 2u) << "no temporary file is left beside model.safetensors, config.json";
}

TEST_F(ZeroTrainTest, AConfigThatIsNoRegularFileIsRefusedNotReadForever) {
  for (const std::string path : {"/dev/zero", "/tmp"}) {
    const RunResult run = run_zero_train(absl::StrCat("--config ", path));
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_THAT(run.output, StartsWith(absl::StrCat("zero-train: --config ", path, ": not a regular file\n")));
  }
}

TEST_F(ZeroTrainTest, ACollectiveDeadlineThatIsNoPositiveNumberIsRefusedNamingTheVariable) {
  for (const std::string value : {"abc", "-1", "0", "inf"}) {
    const RunResult run = run_zero_train(tiny_run_args(""), absl::StrCat("ZERO_COMM_TIMEOUT_S=", value));
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_THAT(run.output, HasSubstr(absl::StrCat("zero-train: ZERO_COMM_TIMEOUT_S = '", value,
                                                   "': the collective deadline is a number of seconds in (0, 1e6]")));
  }
}

TEST_F(ZeroTrainTest, TwoRanksShareOneGpuAndTheLossFalls) {
  ZERO_SKIP_WITHOUT_GPU();
  const std::string path = metrics_path();
  const RunResult run = run_zero_train(absl::StrCat(tiny_run_args(path), " --device=cuda"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("2 local ranks on cuda:0"));
  const std::vector<json> train = events(metrics_lines(path), "train");
  ASSERT_EQ(train.size(), 12u);
  EXPECT_LT(train.back()["loss"].get<double>(), train.front()["loss"].get<double>());
}

TEST_F(ZeroTrainTest, CudaWithoutAGpuExitsTwoSayingWhatIsMissingAndWhatToDo) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is visible";
  const RunResult run = run_zero_train(absl::StrCat(tiny_run_args(metrics_path()), " --device=cuda"));
  EXPECT_EQ(run.exit_code, 2) << run.output;
#ifdef ZERO_HAS_CUDA
  // No driver here reads "no CUDA GPU or driver found" (cuda_runtime_test checks the reasons themselves).
  EXPECT_THAT(run.output, AllOf(StartsWith("zero-train: device = cuda: "), HasSubstr(why_no_cuda_device()),
                                HasSubstr("or use device = cpu")));
#else
  EXPECT_THAT(run.output, HasSubstr("this zero-train was built without CUDA"));
#endif
}

TEST_F(ZeroTrainTest, NcclWithoutMpirunDrivesOneGpuPerRankFromThisProcess) {
  const std::string path = metrics_path();
  const RunResult run = run_zero_train(absl::StrCat(tiny_run_args(path), " --backend=nccl --device=cuda"));
#ifndef ZERO_HAS_NCCL
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, StartsWith("zero-train: "));
  EXPECT_THAT(run.output, HasSubstr("this zero-train was built without"));  // CUDA, or NCCL
#else
  if (cuda_device_count() < 2) {  // refused at once, not after NCCL's initialisation timed out
    EXPECT_NE(run.exit_code, 0);
    EXPECT_THAT(run.output, HasSubstr("nccl in one process: 2 ranks need 2 GPUs"));
  } else {
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output, HasSubstr("2 nccl ranks"));
    const std::vector<json> train = events(metrics_lines(path), "train");
    ASSERT_EQ(train.size(), 12u);
    EXPECT_LT(train.back()["loss"].get<double>(), train.front()["loss"].get<double>());
  }
#endif
}

TEST_F(ZeroTrainTest, HelpPrintsTheUsageAndTheEmbeddedDefault) {
  const RunResult run = run_zero_train("--help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_THAT(run.output, AllOf(HasSubstr("usage: zero-train"), HasSubstr("The embedded default"),
                                HasSubstr("\"train_batch_size\": 64")));
}

TEST_F(ZeroTrainTest, PlotPathDrawsTheRunsLossCurveAndPlotMetricsRedrawsItFromTheFile) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot is not installed";
  const std::string png = dir_.file("loss.png");
  const RunResult run = run_zero_train(absl::StrCat(tiny_run_args(metrics_path()), " --plot_path=", png));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat("loss curve: ", png, " (data ", png, ".csv)")));
  const auto png_signature = [](const std::string& path) {
    std::string head(8, '\0');
    std::ifstream(path, std::ios::binary).read(head.data(), 8);
    return head;
  };
  EXPECT_EQ(png_signature(png), std::string("\x89PNG\r\n\x1a\n", 8));
  // Its data: the 12 training steps, with the validation loss at the two evaluations (steps 6 and 12).
  std::ifstream csv(png + ".csv");
  std::vector<std::string> rows;
  for (std::string line; std::getline(csv, line);) rows.push_back(line);
  ASSERT_EQ(rows.size(), 13u);
  EXPECT_EQ(rows[0], "step,loss,val_loss,lr");
  for (int step = 1; step <= 12; ++step) {
    const std::vector<std::string> cells = absl::StrSplit(rows[step], ',');
    ASSERT_EQ(cells.size(), 4u) << rows[step];
    EXPECT_EQ(cells[0], absl::StrCat(step));
    EXPECT_EQ(cells[2] == "nan", step % 6 != 0) << rows[step];
  }

  const RunResult redraw = run_zero_train(absl::StrCat("--plot_metrics=", metrics_path()));
  ASSERT_EQ(redraw.exit_code, 0) << redraw.output;
  EXPECT_EQ(png_signature(dir_.file("metrics.png")), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST_F(ZeroTrainTest, PlotPathWithoutAMetricsFileIsRefusedBeforeTraining) {
  const RunResult run = run_zero_train("--plot_path=loss.png --metrics_path=");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output,
              HasSubstr("plot_path = loss.png: the curve is drawn from the metrics file: set metrics_path"));
  const RunResult empty = run_zero_train("--plot_metrics=");  // an unset shell variable: no 1800-step default run
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_THAT(empty.output, HasSubstr("--plot_metrics needs a metrics file"));
}

TEST_F(ZeroTrainTest, UnknownKeyExitsTwoNamingIt) {
  const RunResult run = run_zero_train("--zero_optimization.stgae=3");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, AllOf(StartsWith("zero-train: unknown key 'zero_optimization.stgae'"),
                                HasSubstr("did you mean 'zero_optimization.stage'")));
}

TEST_F(ZeroTrainTest, BudgetTooSmallForTheEnginesBuffersExitsTwoNamingTheKey) {
  // Stage 3, C = 128 on 2 ranks: 5 MiB holds the model states, 3.20 MiB, beside one gathered unit and the
  // largest gradient bucket (4.72 MiB: the config-time check passes), but not the two largest buckets and
  // every unit gathered at once, which the engine reserves before any step.
  const RunResult run = run_zero_train(
      absl::StrCat(tiny_run_args(""), " --model.num_layers=2 --model.channels=128 --memory_budget_mib=5"));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, StartsWith("zero-train: memory_budget_mib = 5 is too small: zero: out of memory on rank "));
  EXPECT_THAT(run.output,
              AllOf(HasSubstr("comm_buffers asked for 3.11 MiB (3265536 bytes), but the budget is 5.00 MiB"),
                    HasSubstr("(reserving the engine's largest gradient bucket and gathered units")));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("RESOURCE_EXHAUSTED")));
}

TEST_F(ZeroTrainTest, BudgetBelowStatesAndTheLargestBucketIsRefusedBeforeAnyRankStarts) {
  // The default GPT-2 at stage 0 on 2 ranks: 1.70 MiB of model states fit in 2 MiB, but not beside its
  // one gradient bucket (every unit fits in the first), 436 KiB.
  const RunResult run = run_zero_train(
      absl::StrCat(tiny_run_args(""),
                   " --model.num_layers=2 --model.channels=64 --zero_optimization.stage=0 --memory_budget_mib=2"));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, StartsWith("zero-train: memory_budget_mib = 2: a rank needs 2.13 MiB before any activation "
                                     "at stage 0 on 2 ranks (params 436.00 KiB, grads 436.00 KiB, optimizer state "
                                     "872.00 KiB, master weights 0 B, largest gradient bucket 436.00 KiB)"));
}

// On a device the budget bounds the device's memory: GPT-2 L4 C256 (3.2M parameters) at stage 0 on one rank needs
// 48.91 MiB of it before any activation, 16 bytes a parameter (4 each for params and grads, 8 for AdamW's state; one
// rank with one micro-batch stages no gradient bucket); with the optimizer in host memory its params and grads,
// 24.5 MiB, leave room for the activations of two sequences in 48 MiB.
TEST_F(ZeroTrainTest, TheOptimizerInHostMemoryTrainsWithinADeviceBudgetItsStatesOnTheDeviceExceed) {
  const std::string args =
      "--device=sim --ranks=1 --zero_optimization.stage=0 --model.channels=256 --model.num_layers=4 --steps=3 "
      "--scheduler.type=none --eval_interval=0 --train_micro_batch_size_per_gpu=2 --train_batch_size=2 "
      "--memory_budget_mib=48";
  const RunResult on_device = run_zero_train(args);
  EXPECT_EQ(on_device.exit_code, 2) << on_device.output;
  EXPECT_THAT(on_device.output, StartsWith("zero-train: memory_budget_mib = 48: a rank needs 48.91 MiB before any "
                                           "activation at stage 0 on 1 ranks"));
  const RunResult offloaded = run_zero_train(args + " --zero_optimization.offload_optimizer.device=cpu");
  ASSERT_EQ(offloaded.exit_code, 0) << offloaded.output;
  EXPECT_THAT(offloaded.output, HasSubstr("step 3/3"));
}

// Stage 3 on two ranks, one gathered unit at a time: 30.48 MiB of states, gathered unit and bucket per rank before
// any activation; with the optimizer and the parameter shards in host memory the device holds the gradient shard,
// the gathered unit, the bucket and the activations in 24 MiB.
TEST_F(ZeroTrainTest, Stage3WithOptimizerAndShardsInHostMemoryTrainsWithinADeviceBudgetItsStatesExceed) {
  const std::string args =
      "--device=sim --ranks=2 --zero_optimization.stage=3 --zero_optimization.stage3_param_persistence_threshold=0 "
      "--zero_optimization.stage3_max_live_parameters=1000000 --zero_optimization.stage3_prefetch_bucket_size=1000000 "
      "--model.channels=256 --model.num_layers=4 --steps=3 --scheduler.type=none --eval_interval=0 "
      "--train_micro_batch_size_per_gpu=2 --train_batch_size=4 --memory_budget_mib=24";
  const RunResult on_device = run_zero_train(args);
  EXPECT_EQ(on_device.exit_code, 2) << on_device.output;
  EXPECT_THAT(on_device.output, StartsWith("zero-train: memory_budget_mib = 24: a rank needs 30.48 MiB"));
  const RunResult offloaded = run_zero_train(
      args + " --zero_optimization.offload_optimizer.device=cpu --zero_optimization.offload_param.device=cpu");
  ASSERT_EQ(offloaded.exit_code, 0) << offloaded.output;
  EXPECT_THAT(offloaded.output, HasSubstr("step 3/3"));
}

TEST_F(ZeroTrainTest, BatchMismatchExitsTwoBeforeTraining) {
  const RunResult run = run_zero_train("--ranks 3 --train_batch_size=64 --train_micro_batch_size_per_gpu=16");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, StartsWith("zero-train: train_batch_size 64 != train_micro_batch_size_per_gpu 16"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("step ")));
}

TEST_F(ZeroTrainTest, AnExportPathThatCannotBeWrittenIsRefusedBeforeTraining) {
  // The path is at fault, which the user fixes: exit 2, as for a bad flag, and before any step trains.
  for (const auto& [path, why] :
       {std::pair<std::string, std::string>{"/dev/null/model.safetensors", "/dev/null is not a directory"},
        {"/no/such/dir/model.safetensors", "/no/such/dir does not exist"},
        {"/no/such/dir/", "/no/such/dir does not exist"}}) {
    const RunResult run =
        run_zero_train(absl::StrCat(tiny_run_args(""), " --steps=3 --eval_interval=0 --export_path=", path));
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_THAT(run.output, StartsWith(absl::StrCat("zero-train: export_path = ", path, ": ", why, "\n")));
    EXPECT_THAT(run.output, ::testing::Not(HasSubstr("step 1/3")));
  }
}

TEST_F(ZeroTrainTest, Bf16AndFp16RunsExportTheirWeightsWidenedToFp32) {
  // Before, the export failed after all the training: the writer took only fp32 tensors.
  for (const std::string precision : {"bf16", "fp16"}) {
    const std::string path = dir_.file(precision + ".safetensors");
    const RunResult run = run_zero_train(absl::StrCat(tiny_run_args(""), " --steps=3 --eval_interval=0 --", precision,
                                                      ".enabled=true --export_path=", path));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(path);
    ASSERT_TRUE(file.ok()) << file.status();
    const absl::StatusOr<Tensor> wte = file->get("wte.weight");
    ASSERT_TRUE(wte.ok()) << wte.status();
    EXPECT_EQ(wte->dtype(), DType::kF32);
    // Every value came from a 2-byte one: its low 13 (fp16) or 16 (bf16) mantissa bits are zero.
    const uint32_t low = precision == "bf16" ? 0xFFFFu : 0x1FFFu;
    for (int64_t k = 0; k < wte->numel(); ++k) {
      ASSERT_EQ(float_bits(wte->data_as<float>()[k]) & low, 0u) << precision << " element " << k;
    }
  }
}

// The export at `base` as GPT2LMHeadModel.save_pretrained(torch_dtype=torch.bfloat16) writes a model of 1024
// positions: "transformer." names, BF16, wpe rows past the export's (0.5), and lm_head.weight, wte's copy.
void write_as_save_pretrained(const std::string& base, const std::string& path) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(base);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::vector<uint16_t>> data;  // the tensors' bytes, until written
  data.reserve(file->entries().size());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const SafetensorsEntry& e : file->entries()) {
    const Tensor t = *file->get(e.name);
    Shape shape = t.shape();
    if (e.name == "wpe.weight") shape[0] = 1024;
    std::vector<uint16_t>& bf16 = data.emplace_back(shape_numel(shape), float_to_bf16(0.5f));
    for (int64_t i = 0; i < t.numel(); ++i) bf16[i] = float_to_bf16(t.data_as<float>()[i]);
    tensors.emplace_back("transformer." + e.name, Tensor(bf16.data(), DType::kBF16, shape));
    if (e.name == "wte.weight") tensors.emplace_back("lm_head.weight", tensors.back().second);
  }
  ASSERT_TRUE(write_safetensors(path, tensors).ok());
}

TEST_F(ZeroTrainTest, FineTuningAShorterContextFromSavePretrainedBf16WeightsTakesTheirFirstPositions) {
  const std::string base = dir_.file("base.safetensors");
  const RunResult first =
      run_zero_train(absl::StrCat(tiny_run_args(""), " --steps=3 --eval_interval=0 --export_path=", base));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string hub = dir_.file("hub.safetensors");
  write_as_save_pretrained(base, hub);

  // With lr 0 the export is the weights as loaded: the base's, rounded to bf16 and widened back. Exported to a
  // directory, they come with the config.json transformers reads, of the model's own positions.
  const std::string folder = dir_.file("tuned/");
  ASSERT_TRUE(std::filesystem::create_directory(folder));
  const std::string tuned = folder + "model.safetensors";
  const RunResult run = run_zero_train(
      absl::StrCat(tiny_run_args(""), " --steps=3 --eval_interval=0 --optimizer.params.lr=0 --init_from=", hub,
                   " --export_path=", folder));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat("\nexported ", tuned, " and ", folder, "config.json\n")));
  std::ifstream config_file(folder + "config.json");
  const json config = json::parse(config_file, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(config.is_object()) << file_bytes(folder + "config.json");
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat("\n  init_from ", hub,
                                                 ": wpe.weight has 1024 positions; the model "
                                                 "(max_seq_len ")));
  EXPECT_THAT(run.output, HasSubstr("; tensors in BF16, widened exactly to fp32; lm_head.weight equals wte.weight "
                                    "(the tied head)\n"));
  const SafetensorsFile want = *SafetensorsFile::read(base);
  const SafetensorsFile got = *SafetensorsFile::read(tuned);
  EXPECT_EQ(config["n_positions"], (*want.get("wpe.weight")).shape()[0]);
  EXPECT_EQ(config["vocab_size"], (*want.get("wte.weight")).shape()[0]);
  ASSERT_EQ(got.entries().size(), want.entries().size());
  for (const SafetensorsEntry& e : want.entries()) {
    const absl::StatusOr<Tensor> g = got.get(e.name, DType::kF32, e.shape);  // wpe: the model's own positions
    ASSERT_TRUE(g.ok()) << g.status();
    const Tensor w = *want.get(e.name);
    for (int64_t i = 0; i < w.numel(); ++i) {
      ASSERT_EQ(g->data_as<float>()[i], bf16_to_float(float_to_bf16(w.data_as<float>()[i]))) << e.name << " " << i;
    }
  }
}

TEST_F(ZeroTrainTest, LocalRanksInOneOfSeveralProcessesAreRefusedNamingTheLaunchersVariable) {
  // Each of the processes would train a model of its own: refused before any training, naming the fix.
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "WORLD_SIZE"}) {
    const RunResult run = run_zero_train(tiny_run_args(metrics_path()), absl::StrCat(variable, "=2"));
    EXPECT_EQ(run.exit_code, 2) << variable;
    EXPECT_THAT(run.output, HasSubstr(absl::StrCat("backend = local starts all 2 rank(s) inside this process, but ",
                                                   variable, "=2 says it is one of 2 processes")));
    EXPECT_THAT(run.output, HasSubstr("add --backend=mpi"));
    EXPECT_FALSE(std::filesystem::exists(metrics_path())) << variable << ": nothing may train";
  }
}

#ifdef ZERO_HAS_NCCL  // elsewhere --device=cuda or --backend=nccl is refused before
TEST_F(ZeroTrainTest, NcclRanksOfOneProcessUnderATorchrunStyleLauncherAreRefused) {
  const RunResult run =
      run_zero_train(absl::StrCat(tiny_run_args(metrics_path()), " --backend=nccl --device=cuda"), "WORLD_SIZE=4");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("backend = nccl starts all 2 rank(s) inside this process, but WORLD_SIZE=4"));
  EXPECT_THAT(run.output, HasSubstr("torchrun-style launchers are not supported: start one process with --ranks 4"));
}
#endif

#ifdef ZERO_MPIEXEC
TEST_F(ZeroTrainTest, MpirunWithoutAnMpiBackendIsRefusedRatherThanTrainingTwoCopies) {
  const RunResult run = run_zero_train(tiny_run_args(metrics_path()), mpiexec_launcher(ZERO_MPIEXEC, 2));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.output, HasSubstr("OMPI_COMM_WORLD_SIZE=2 says it is one of 2 processes"));
  EXPECT_FALSE(std::filesystem::exists(metrics_path()));
}

TEST_F(ZeroTrainTest, MpiRanksStartedByAnotherLauncherAreRefused) {
  // One MPI process that a torchrun-style launcher counted as one of two (WORLD_SIZE=2) would train alone.
  const RunResult run = run_zero_train(absl::StrCat(tiny_run_args(metrics_path()), " --backend=mpi"),
                                       absl::StrCat("WORLD_SIZE=2 ", mpiexec_launcher(ZERO_MPIEXEC, 1)));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("zero-train: backend = mpi: WORLD_SIZE is 2 but MPI sees 1 rank(s); start the "
                                    "ranks with mpirun -np 2"));
}

TEST_F(ZeroTrainTest, MpiBackendUnderMpiexecTrains) {
  const std::string path = metrics_path();
  const RunResult run =
      run_zero_train(absl::StrCat(tiny_run_args(path), " --backend=mpi"), mpiexec_launcher(ZERO_MPIEXEC, 2));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // Open MPI gives its ranks a pseudo-terminal; the bar would be redrawn with '\r' by every rank.
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("\r"))) << "a progress bar under mpirun";
  const std::vector<json> train = events(metrics_lines(path), "train");
  ASSERT_EQ(train.size(), 12u);
  EXPECT_LT(train.back()["loss"].get<double>(), train.front()["loss"].get<double>());
}

// The mpi backend receives into scratch buffers that the local backend (which reads its peers' memory) does
// not need: they come from the rank's allocator, so they show in comm_buffers and count against the budget.
TEST_F(ZeroTrainTest, MpiBackendsScratchShowsInTheMemoryReport) {
  const std::string local_path = dir_.file("local.jsonl");
  const std::string mpi_path = dir_.file("mpi.jsonl");
  const RunResult local = run_zero_train(tiny_run_args(local_path));
  ASSERT_EQ(local.exit_code, 0) << local.output;
  const RunResult mpi =
      run_zero_train(absl::StrCat(tiny_run_args(mpi_path), " --backend=mpi"), mpiexec_launcher(ZERO_MPIEXEC, 2));
  ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
  const std::vector<json> local_summary = events(metrics_lines(local_path), "summary");
  const std::vector<json> mpi_summary = events(metrics_lines(mpi_path), "summary");
  ASSERT_EQ(local_summary.size(), 1u);
  ASSERT_EQ(mpi_summary.size(), 1u);
  ASSERT_EQ(mpi_summary[0]["peak_bytes"].size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    const json& l = local_summary[0]["peak_bytes"][rank];
    const json& m = mpi_summary[0]["peak_bytes"][rank];
    EXPECT_GT(m["comm_buffers"].get<int64_t>(), l["comm_buffers"].get<int64_t>()) << "rank " << rank;
    EXPECT_EQ(m["params"], l["params"]);
    EXPECT_EQ(m["optimizer_state"], l["optimizer_state"]);
  }
}

TEST_F(ZeroTrainTest, BadInputUnderMpiexecPrintsThePlainMessageAndExitsTwo) {
  // The default batch (64 = 16 x 4) does not divide over 3 ranks: found by each rank once MPI tells the world size.
  const RunResult run = run_zero_train("--backend=mpi --steps=30 --metrics_path=", mpiexec_launcher(ZERO_MPIEXEC, 3));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("zero-train: train_batch_size 64 != train_micro_batch_size_per_gpu 16 * "
                                    "gradient_accumulation_steps 1 * ranks 3 (= 48)"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("INVALID_ARGUMENT")));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("zero: rank")));
}

TEST_F(ZeroTrainTest, MpiRanksResumeALocalCheckpointToTheSameBits) {
  // Saved by 2 local ranks at step 8 of 12, finished by 2 MPI processes: the mpi backend reduces in the
  // local backend's rank order, so the export equals the local run's that never stopped.
  const std::filesystem::path& dir = dir_.path();
  const auto args = [&](const std::string& name, const std::string& more) {
    return absl::StrCat(tiny_run_args(""), " --export_path=", (dir / (name + ".safetensors")).string(), " ", more);
  };
  const RunResult local = run_zero_train(
      args("local", absl::StrCat("--checkpoint.dir=", (dir / "ckpt").string(), " --checkpoint.interval=8")));
  ASSERT_EQ(local.exit_code, 0) << local.output;
  const RunResult mpi = run_zero_train(
      args("mpi", absl::StrCat("--backend=mpi --checkpoint.resume=", (dir / "ckpt" / "step-00000008").string())),
      mpiexec_launcher(ZERO_MPIEXEC, 2));
  ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
  EXPECT_THAT(mpi.output, HasSubstr("resumed after step 8"));
  const std::string exported = file_bytes((dir / "local.safetensors").string());
  ASSERT_FALSE(exported.empty());
  EXPECT_TRUE(file_bytes((dir / "mpi.safetensors").string()) == exported);
}
#endif

}  // namespace
}  // namespace zero::train
