// zero-train's config: parsing, overrides, DeepSpeed's defaults and units, the batch rule, errors that name their key.
#include "examples/train/train_config.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "examples/train/auto_values.h"
#include "examples/train/deepspeed_optim.h"

namespace zero::train {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The smallest valid config: the batch rule needs one of its keys.
constexpr char kMinimal[] = R"({"train_micro_batch_size_per_gpu": 2})";

TrainConfig parse_ok(const std::string& json, const std::vector<std::string>& overrides = {}) {
  absl::StatusOr<TrainConfig> config = parse_train_config(json, overrides);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : TrainConfig{};
}

std::string parse_error(const std::string& json, const std::vector<std::string>& overrides = {}) {
  absl::StatusOr<TrainConfig> config = parse_train_config(json, overrides);
  EXPECT_FALSE(config.ok());
  return std::string(config.status().message());
}

TEST(TrainConfigTest, EmbeddedDefaultIsStage3OnFourLocalRanks) {
  const TrainConfig c = parse_ok(default_config_json());
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_EQ(c.backend, "local");
  EXPECT_EQ(c.ranks, 4);
  EXPECT_EQ(c.model.type, "gpt2");
  EXPECT_EQ(c.data.source, "addition");
  const absl::StatusOr<BatchPlan> batch = resolve_batch(c, c.ranks);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->train_batch_size, batch->micro_batch * batch->accumulation_steps * 4);
}

TEST(TrainConfigTest, AbsentKeysTakeDeepSpeedDefaults) {
  const TrainConfig c = parse_ok(kMinimal);
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 500'000'000);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 1'000'000'000);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 100'000);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_FALSE(c.bf16);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1);
  EXPECT_FALSE(c.train_batch_size.has_value());
  EXPECT_FALSE(c.gradient_accumulation_steps.has_value());
}

TEST(TrainConfigTest, ReadsNestedSectionsAndIntegersWrittenAsFloats) {
  const TrainConfig c = parse_ok(R"({
    "train_batch_size": 32, "gradient_clipping": 0.5,
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e7, "overlap_comm": false, "wrap_min_params": 1e6},
    "fp16": {"enabled": true, "loss_scale": 128, "hysteresis": 4},
    "optimizer": {"type": "Lamb", "params": {"lr": 0.01, "betas": [0.8, 0.99], "eps": 1e-6}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.02, "warmup_num_steps": 7}},
    "model": {"preset": "tiny"}, "data": {"addition": {"digits": 2}}})");
  EXPECT_EQ(c.train_batch_size, 32);
  EXPECT_EQ(c.gradient_clipping, 0.5);
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 50'000'000);
  EXPECT_FALSE(c.zero_optimization.overlap_comm);
  EXPECT_EQ(c.zero_optimization.wrap_min_params, 1'000'000);
  EXPECT_FALSE(c.zero_optimization.no_sync);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 128);
  EXPECT_EQ(c.fp16.hysteresis, 4);
  EXPECT_EQ(c.optimizer.type, "Lamb");
  EXPECT_EQ(c.optimizer.lr, 0.01);
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.8, 0.99}));
  EXPECT_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  EXPECT_EQ(c.scheduler.warmup_max_lr, 0.02);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 7);
  EXPECT_EQ(c.model.preset, "tiny");
  EXPECT_EQ(c.data.digits, 2);
}

TEST(TrainConfigTest, OverridesReplaceAddAndParseTheirValuesAsJson) {
  const TrainConfig c =
      parse_ok(default_config_json(), {"zero_optimization.stage=1", "optimizer.type=SGD",
                                       "optimizer.params.momentum=0.9", "optimizer.params.betas=[0.5,0.6]",
                                       "bf16.enabled=true", "ranks=2", "ranks=3", "metrics_path=out/m.jsonl"});
  EXPECT_EQ(c.zero_optimization.stage, 1);
  EXPECT_EQ(c.optimizer.type, "SGD");  // not JSON, so a string
  EXPECT_EQ(c.optimizer.momentum, 0.9);
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.5, 0.6}));
  EXPECT_TRUE(c.bf16);    // a section the default does not have
  EXPECT_EQ(c.ranks, 3);  // the later override wins
  EXPECT_EQ(c.metrics_path, "out/m.jsonl");
}

TEST(TrainConfigTest, AnOverrideOfNullRemovesTheKeySoItsDefaultApplies) {
  const TrainConfig c = parse_ok(default_config_json(), {"gradient_clipping=null", "optimizer.params=null",
                                                         "zero_optimization.stage3_param_persistence_threshold=null"});
  EXPECT_EQ(c.gradient_clipping, 0);                                           // the default's 1.0 removed
  EXPECT_EQ(c.optimizer.lr, 1e-3);                                             // the whole params object
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 100'000);  // DeepSpeed's default
  EXPECT_EQ(c.zero_optimization.stage, 3);                                     // its siblings stay
  // Removing a key the config does not hold is no error: it is absent, as asked.
  EXPECT_EQ(parse_ok(kMinimal, {"checkpoint.dir=null", "data.tokens.train=null"}).checkpoint.dir, "");
}

TEST(TrainConfigTest, SchedulerTypeNoneInAnyCaseKeepsTheOptimizersLr) {
  for (const char* none : {"scheduler.type=none", "scheduler.type=None", "scheduler.type=NONE"}) {
    const TrainConfig c = parse_ok(default_config_json(), {none, "optimizer.params.lr=0.25"});
    EXPECT_EQ(c.scheduler.type, "");
    EXPECT_FLOAT_EQ(LrSchedule(c.scheduler, c.optimizer.lr, c.steps).lr(1), 0.25f);
  }
}

struct BadConfig {
  std::string override_arg;
  std::vector<std::string> expected;  // substrings of the message
};

class TrainConfigErrorTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(TrainConfigErrorTest, IsRefusedNamingTheKey) {
  const std::string message = parse_error(kMinimal, {GetParam().override_arg});
  for (const std::string& part : GetParam().expected) EXPECT_THAT(message, HasSubstr(part));
}

INSTANTIATE_TEST_SUITE_P(
    Refused, TrainConfigErrorTest,
    ::testing::Values(
        BadConfig{"zero_optimization.stgae=3",
                  {"unknown key 'zero_optimization.stgae'", "did you mean 'zero_optimization.stage'"}},
        BadConfig{"optimiser.type=Adam", {"unknown key 'optimiser'", "did you mean 'optimizer'"}},
        BadConfig{"zero_optimization.stage=\"three\"", {"zero_optimization.stage: expected an integer", "\"three\""}},
        BadConfig{"zero_optimization.stage=2.5", {"zero_optimization.stage: expected an integer"}},
        BadConfig{"zero_optimization=3", {"zero_optimization: expected an object"}},
        BadConfig{"fp16.enabled=1", {"fp16.enabled: expected true or false"}},
        BadConfig{"optimizer.params.betas=0.9", {"optimizer.params.betas: expected an array of numbers"}},
        BadConfig{"zero_optimization.stage=4", {"zero_optimization.stage = 4", "0, 1, 2 or 3"}},
        BadConfig{"zero_optimization.stage=-1", {"zero_optimization.stage = -1"}},
        BadConfig{"zero_optimization.reduce_bucket_size=-1", {"zero_optimization.reduce_bucket_size = -1"}},
        BadConfig{"zero_optimization.allgather_bucket_size=0", {"zero_optimization.allgather_bucket_size = 0"}},
        BadConfig{"zero_optimization.stage3_max_live_parameters=0",
                  {"zero_optimization.stage3_max_live_parameters = 0"}},
        BadConfig{"train_batch_size=0", {"train_batch_size = 0"}},
        BadConfig{"gradient_clipping=-1", {"gradient_clipping = -1"}},
        BadConfig{"fp16.min_loss_scale=0", {"fp16.min_loss_scale = 0"}},
        BadConfig{"optimizer.type=Adagrad", {"optimizer.type = Adagrad", "Adam, AdamW, Lamb or SGD"}},
        BadConfig{"optimizer.params.betas=[0.9]", {"optimizer.params.betas = 0.9", "two numbers"}},
        BadConfig{"scheduler.type=OneCycle", {"scheduler.type = OneCycle"}},
        BadConfig{"scheduler.params.warmup_type=cubic", {"scheduler.params.warmup_type = cubic"}},
        BadConfig{"model.type=cnn", {"model.type = cnn", "use gpt2 or mlp"}},
        BadConfig{"model.type=mlp", {"data.source = addition", "the mlp reads labelled features: use blobs"}},
        BadConfig{"data.source=blobs", {"data.source = blobs", "gpt2 reads token sequences"}},
        BadConfig{"data.blobs.classes=1", {"data.blobs.classes = 1", "must be >= 2"}},
        BadConfig{"data.blobs.noise=-0.5", {"data.blobs.noise = -0.5"}},
        BadConfig{"model.widths=[16, 64, 4.5]", {"model.widths: expected an array of integers"}},
        BadConfig{"model.preset=d7", {"model.preset"}},
        BadConfig{"model.channels=30", {"model.channels = 30", "multiple of model.num_heads (4)"}},
        BadConfig{"data.source=web", {"data.source = web"}},
        BadConfig{"data.addition.digits=10", {"data.addition.digits = 10"}},
        BadConfig{"backend=nccl", {"backend = nccl", "set device = cuda"}},
        BadConfig{"device=tpu", {"device = tpu", "use cpu, cuda, or sim"}},
        BadConfig{"tf32=true", {"tf32 = true", "device cpu computes fp32 GEMMs exactly", "set device = cuda"}},
        BadConfig{"backend=gloo", {"backend = gloo"}}, BadConfig{"ranks=0", {"ranks = 0"}},
        BadConfig{"steps=0", {"steps = 0"}}, BadConfig{"memory_budget_mib=-5", {"memory_budget_mib = -5"}},
        BadConfig{"checkpoint.interval=-1", {"checkpoint.interval = -1"}},
        BadConfig{"zero_optimization.offload_optimizer.device=cpu",
                  {"zero_optimization.offload_optimizer.device = cpu", "the engine is on the CPU", "use none"}},
        BadConfig{"zero_optimization.offload_optimizer.device=disk",
                  {"offload_optimizer.device = disk", "none, cpu or nvme"}},
        BadConfig{"zero_optimization.offload_optimizer.device=nvme",
                  {"offload_optimizer.nvme_path", "name a directory"}},
        BadConfig{"zero_optimization.offload_param.device=nvme", {"offload_param.nvme_path", "name a directory"}},
        BadConfig{"zero_optimization.offload_param.device=cpu",
                  {"offload_param.device = cpu", "the engine is on the CPU"}},
        BadConfig{"checkpoint.keep_last=-2", {"checkpoint.keep_last = -2"}},
        BadConfig{"checkpoint.resume=latest", {"checkpoint.resume = latest", "needs checkpoint.dir"}},
        BadConfig{"steps_per_print=0", {"steps_per_print = 0", "at least 1"}},
        BadConfig{"zero_optimization.contiguous_gradients=false",
                  {"zero_optimization.contiguous_gradients = false: zero always runs as true", "flat bucket"}},
        BadConfig{"prescale_gradients=true", {"prescale_gradients = true: zero always runs as false"}},
        BadConfig{"gradient_predivide_factor=2", {"gradient_predivide_factor = 2", "always runs as 1.0"}},
        BadConfig{"tensorboard={\"enabled\": true}", {"tensorboard.enabled = true", "metrics_path"}},
        BadConfig{"activation_checkpointing={}", {"zero does not take 'activation_checkpointing'", "recompute"}},
        BadConfig{"log_interval=10", {"zero does not take 'log_interval': renamed steps_per_print"}},
        BadConfig{"fp16.fp16_master_weights_and_grads=true",
                  {"fp16.fp16_master_weights_and_grads = true: zero always runs as false", "fp32 master weights"}},
        BadConfig{"zero_optimization.cpu_offload=true",
                  {"zero_optimization.cpu_offload = true", "old name for zero_optimization.offload_optimizer.device",
                   "device = cpu instead"}}));

// A bf16/fp16 model has no fp32 GEMM for TF32 to change: the key would do nothing.
TEST(TrainConfigErrors, Tf32WithAHalfPrecisionIsRefused) {
  for (const std::string half : {"bf16", "fp16"}) {
    const std::string message = parse_error(kMinimal, {"device=cuda", "tf32=true", half + ".enabled=true"});
    EXPECT_THAT(message, HasSubstr("tf32 = true")) << half;
    EXPECT_THAT(message, HasSubstr("set tf32 false")) << half;
  }
}

TEST(TrainConfigTest, AcceptsTheKeysDeepSpeedConfigsCarryThatAskWhatZeroDoes) {
  parse_ok(kMinimal,
           {"zero_optimization.stage3_gather_16bit_weights_on_model_save=true",
            "zero_optimization.stage3_gather_fp16_weights_on_model_save=true", "optimizer.params.torch_adam=true",
            "fp16.fp16_master_weights_and_grads=false", "zero_optimization.cpu_offload=false"});
}

TEST(TrainConfigTest, ACloseTypoIsAnsweredWithTheKeyItMisspells) {
  EXPECT_EQ(parse_error(kMinimal, {"zero_optimization.reduce_bucket_sise=5"}),
            "unknown key 'zero_optimization.reduce_bucket_sise'; did you mean 'zero_optimization.reduce_bucket_size'?");
  // The typo is in the last component, wherever the key sits: a known key of that name is suggested.
  EXPECT_THAT(parse_error(kMinimal, {"optimizer.lr=0.1"}), HasSubstr("did you mean 'optimizer.params.lr'?"));
}

TEST(TrainConfigTest, AFarKeyIsRefusedWithoutASuggestion) {
  for (const char* far : {"sparse_attention={}", "checkpoint.every=5", "zero_optimization.xy=1"}) {
    const std::string message = parse_error(kMinimal, {far});
    EXPECT_THAT(message, AllOf(HasSubstr("unknown key '"), HasSubstr("remove it")));
    EXPECT_THAT(message, ::testing::Not(HasSubstr("did you mean")));
  }
}

TEST(TrainConfigTest, TakesATypicalDeepSpeedZero3Config) {
  // The zero_optimization block of DeepSpeed's and Hugging Face's ZeRO-3 examples, with NVMe offload and
  // disabled loggers.
  const TrainConfig c = parse_ok(R"({
    "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
    "steps_per_print": 25, "wall_clock_breakdown": true, "prescale_gradients": false,
    "zero_allow_untested_optimizer": true, "tensorboard": {"enabled": false, "output_path": "logs/"},
    "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true, "reduce_scatter": true,
                          "sub_group_size": 1e9, "reduce_bucket_size": 5e8, "stage3_prefetch_bucket_size": 5e7,
                          "stage3_param_persistence_threshold": 1e5, "stage3_max_live_parameters": 1e9,
                          "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true,
                          "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true}},
    "model": {"preset": "tiny"}})");
  EXPECT_EQ(c.steps_per_print, 25);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_EQ(c.zero_optimization.offload_param.nvme_path, "/local_nvme");
}

TEST(TrainConfigTest, RecomputeIsGpt2sAndRefusedForTheMlp) {
  EXPECT_TRUE(parse_ok(kMinimal, {"model.recompute=true"}).model.recompute);
  EXPECT_THAT(parse_error(kMinimal, {"model.type=mlp", "data.source=blobs", "model.recompute=true"}),
              HasSubstr("model.recompute = true: only GPT-2's blocks recompute their activations"));
}

TEST(TrainConfigTest, MlpReadsWidthsAndBlobsKeys) {
  const TrainConfig c =
      parse_ok(kMinimal, {"model.type=mlp", "model.widths=[8, 32, 3]", "data.source=blobs", "data.blobs.features=8",
                          "data.blobs.classes=3", "data.blobs.noise=0.5", "data.blobs.train_rows=512",
                          "data.blobs.val_rows=64", "data.blobs.seed=9"});
  EXPECT_EQ(c.model.type, "mlp");
  EXPECT_EQ(c.model.widths, (std::vector<int64_t>{8, 32, 3}));
  EXPECT_EQ(c.data.source, "blobs");
  EXPECT_EQ(c.data.blobs.features, 8);
  EXPECT_EQ(c.data.blobs.classes, 3);
  EXPECT_EQ(c.data.blobs.noise, 0.5);
  EXPECT_EQ(c.data.blobs.train_rows, 512);
  EXPECT_EQ(c.data.blobs.val_rows, 64);
  EXPECT_EQ(c.data.blobs.seed, 9u);
}

TEST(TrainConfigTest, MlpDefaultsFitTheBlobsDefaults) {
  const TrainConfig c = parse_ok(kMinimal, {"model.type=mlp", "data.source=blobs"});
  EXPECT_EQ(c.model.widths, (std::vector<int64_t>{16, 64, 64, 4}));
  EXPECT_EQ(c.data.blobs.features, 16);
  EXPECT_EQ(c.data.blobs.classes, 4);
}

TEST(TrainConfigTest, MlpWidthsMustMatchTheDataNamingBothKeys) {
  EXPECT_EQ(parse_error(kMinimal, {"model.type=mlp", "data.source=blobs", "model.widths=[16, 64, 10]"}),
            "model.widths = [16, 64, 10] must start with data.blobs.features (16) and end with data.blobs.classes (4); "
            "change one to match the other");
  EXPECT_THAT(parse_error(kMinimal, {"model.type=mlp", "data.source=blobs", "data.blobs.features=3"}),
              AllOf(HasSubstr("model.widths = [16, 64, 64, 4]"), HasSubstr("data.blobs.features (3)")));
  EXPECT_THAT(parse_error(kMinimal, {"model.type=mlp", "data.source=blobs", "model.widths=[4]"}),
              HasSubstr("model.widths = [4]: must be two or more positive widths"));
}

TEST(TrainConfigTest, Bf16AndFp16TogetherAreRefusedNamingBoth) {
  EXPECT_THAT(parse_error(kMinimal, {"bf16.enabled=true", "fp16.enabled=true"}),
              AllOf(HasSubstr("bf16.enabled"), HasSubstr("fp16.enabled")));
}

TEST(TrainConfigTest, DecayingScheduleMustOutlastItsWarmup) {
  EXPECT_THAT(
      parse_error(kMinimal, {"scheduler.type=WarmupDecayLR", "scheduler.params.warmup_num_steps=100",
                             "scheduler.params.total_num_steps=50"}),
      AllOf(HasSubstr("scheduler.params.total_num_steps = 50"), HasSubstr("scheduler.params.warmup_num_steps = 100")));
  // Left out, total_num_steps is the run's steps: the error names the key the user set.
  EXPECT_THAT(
      parse_error(kMinimal, {"scheduler.type=WarmupCosineLR", "scheduler.params.warmup_num_steps=20", "steps=5"}),
      AllOf(HasSubstr("steps = 5 (scheduler.params.total_num_steps defaults to it)"),
            HasSubstr("scheduler.params.warmup_num_steps = 20")));
}

TEST(TrainConfigTest, TheEmbeddedDefaultsWarmupShrinksToATenthOfAShortRun) {
  EXPECT_EQ(parse_ok(default_config_json()).scheduler.warmup_num_steps, 20);
  const absl::StatusOr<TrainConfig> whole = parse_default_config({});
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->scheduler.warmup_num_steps, 20);  // 1800 steps: a tenth is more than the default's 20
  const absl::StatusOr<TrainConfig> short_run = parse_default_config({"steps=8"});
  ASSERT_TRUE(short_run.ok()) << short_run.status();
  EXPECT_EQ(short_run->scheduler.warmup_num_steps, 0);  // DeepSpeed's floor of 2 steps, then the cosine
  const LrSchedule schedule(short_run->scheduler, short_run->optimizer.lr, short_run->steps);
  EXPECT_GT(schedule.lr(3), schedule.lr(8));
  EXPECT_EQ(parse_default_config({"steps=100"})->scheduler.warmup_num_steps, 10);
}

TEST(TrainConfigTest, AWarmupTheUserSetThatOutlastsTheRunStaysAnError) {
  const absl::StatusOr<TrainConfig> set = parse_default_config({"steps=8", "scheduler.params.warmup_num_steps=20"});
  ASSERT_FALSE(set.ok());
  EXPECT_THAT(set.status().message(), AllOf(HasSubstr("steps = 8"), HasSubstr("warmup_num_steps = 20")));
  EXPECT_FALSE(parse_default_config({"steps=8", "scheduler={\"type\": \"WarmupDecayLR\"}"}).ok());  // 1000
  // A config file's warmup is the user's: the same text given as --config is not adjusted.
  EXPECT_THAT(parse_error(default_config_json(), {"steps=8"}), HasSubstr("or set scheduler.type = none"));
}

TEST(TrainConfigTest, MalformedJsonIsRefusedAtItsLineAndColumn) {
  EXPECT_THAT(parse_error("{\"steps\": 3,\n \"ranks\": 2,\n  \"seed\" 7}"),
              HasSubstr("not valid JSON at line 3, column 10"));
  EXPECT_THAT(parse_error("[1, 2]"), HasSubstr("the config is array, not a JSON object"));
}

TEST(TrainConfigTest, LambTakesFusedLambsBiasCorrectionAndTrustRatioRange) {
  const TrainConfig defaults = parse_ok(kMinimal, {"optimizer.type=Lamb"});
  EXPECT_TRUE(defaults.optimizer.bias_correction);
  EXPECT_EQ(defaults.optimizer.max_coeff, 10.0);
  EXPECT_EQ(defaults.optimizer.min_coeff, 0.01);
  const TrainConfig c = parse_ok(kMinimal, {"optimizer.type=Lamb", "optimizer.params.bias_correction=false",
                                            "optimizer.params.max_coeff=0.3", "optimizer.params.min_coeff=0"});
  EXPECT_FALSE(c.optimizer.bias_correction);
  EXPECT_EQ(c.optimizer.max_coeff, 0.3);
  EXPECT_EQ(c.optimizer.min_coeff, 0);
  EXPECT_THAT(parse_error(kMinimal, {"optimizer.params.min_coeff=20"}),
              HasSubstr("optimizer.params.min_coeff/max_coeff = 20/10: the trust ratio's range needs 0 <= min_coeff"));
}

TEST(TrainConfigTest, OptimizerTypeIsReadInAnyCase) {
  EXPECT_EQ(parse_ok(kMinimal, {"optimizer.type=adamw"}).optimizer.type, "AdamW");
  EXPECT_EQ(parse_ok(kMinimal, {"optimizer.type=LAMB"}).optimizer.type, "Lamb");
  EXPECT_EQ(parse_ok(kMinimal, {"optimizer.type=sgd"}).optimizer.type, "SGD");
  EXPECT_EQ(parse_ok(kMinimal, {"optimizer.type=ADAM"}).optimizer.type, "Adam");
  EXPECT_EQ(parse_ok(kMinimal, {"optimizer.type=AdamW"}).optimizer.type, "AdamW");
  EXPECT_THAT(parse_error(kMinimal, {"optimizer.type=adamax"}),
              HasSubstr("optimizer.type = adamax: use Adam, AdamW, Lamb or SGD (in any case)"));
}

TEST(TrainConfigTest, AcceptsDeepSpeedsSwapperTuningWithNoEffect) {
  const TrainConfig c = parse_ok(R"({"train_micro_batch_size_per_gpu": 2,
    "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": false, "overlap_events": true},
    "fp16": {"auto_cast": false, "consecutive_hysteresis": false},
    "zero_optimization": {"stage": 3,
      "offload_param": {"buffer_count": 5, "buffer_size": 1e8, "max_in_cpu": 1e9},
      "offload_optimizer": {"buffer_count": 4, "pipeline_read": false, "pipeline_write": false,
                            "fast_init": false}}})");
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_THAT(parse_error(kMinimal, {"fp16.auto_cast=true"}),
              HasSubstr("fp16.auto_cast = true: zero always runs as false"));
  EXPECT_THAT(parse_error(kMinimal, {"fp16.consecutive_hysteresis=true"}),
              HasSubstr("fp16.consecutive_hysteresis = true: zero always runs as false"));
}

absl::StatusOr<BatchPlan> batch_of(std::optional<int64_t> global, std::optional<int64_t> micro,
                                   std::optional<int64_t> accumulation, int world_size) {
  TrainConfig c;
  c.train_batch_size = global;
  c.train_micro_batch_size_per_gpu = micro;
  c.gradient_accumulation_steps = accumulation;
  return resolve_batch(c, world_size);
}

void expect_plan(const absl::StatusOr<BatchPlan>& plan, int64_t global, int64_t micro, int64_t accumulation) {
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->train_batch_size, global);
  EXPECT_EQ(plan->micro_batch, micro);
  EXPECT_EQ(plan->accumulation_steps, accumulation);
}

TEST(BatchRuleTest, AnyTwoDetermineTheThird) {
  expect_plan(batch_of(96, 4, std::nullopt, 4), 96, 4, 6);
  expect_plan(batch_of(96, std::nullopt, 3, 4), 96, 8, 3);
  expect_plan(batch_of(std::nullopt, 4, 3, 4), 48, 4, 3);
  expect_plan(batch_of(96, 8, 3, 4), 96, 8, 3);
}

TEST(BatchRuleTest, OneAloneMeansNoAccumulation) {
  expect_plan(batch_of(64, std::nullopt, std::nullopt, 4), 64, 16, 1);
  expect_plan(batch_of(std::nullopt, 5, std::nullopt, 3), 15, 5, 1);
}

TEST(BatchRuleTest, MismatchNamesAllFourNumbers) {
  const absl::StatusOr<BatchPlan> plan = batch_of(32, 4, 3, 4);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(),
              AllOf(HasSubstr("train_batch_size 32"), HasSubstr("train_micro_batch_size_per_gpu 4"),
                    HasSubstr("gradient_accumulation_steps 3"), HasSubstr("ranks 4"), HasSubstr("= 48")));
}

TEST(BatchRuleTest, GlobalBatchNotDivisibleByTheRanksIsAMismatch) {
  const absl::StatusOr<BatchPlan> plan = batch_of(30, 4, std::nullopt, 4);  // 30 / 16 rounds down to 1
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), AllOf(HasSubstr("train_batch_size 30"), HasSubstr("= 16")));
}

TEST(BatchRuleTest, AccumulationAloneIsNotEnough) {
  const absl::StatusOr<BatchPlan> plan = batch_of(std::nullopt, std::nullopt, 2, 4);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("train_micro_batch_size_per_gpu"));
}

// --- "auto", the Hugging Face Trainer's placeholder (examples/train/auto_values.h) ---------------------

constexpr char kAllAuto[] = R"({
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto", "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                    "warmup_num_steps": "auto", "total_num_steps": "auto"}},
  "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                        "stage3_param_persistence_threshold": "auto"}})";

TEST(AutoValuesTest, EveryAutoOfTheTrainersConfigsIsFilledAsTheTrainerWould) {
  const TrainConfig c = parse_ok(kAllAuto, {"optimizer.params.lr=0.01"});
  expect_plan(resolve_batch(c, 4), 32, kAutoMicroBatch, 1);
  EXPECT_EQ(c.gradient_clipping, 1.0);  // max_grad_norm
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16);
  EXPECT_EQ(c.optimizer.lr, 0.01);  // an override replaces the "auto"
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 0.01);  // the optimizer's lr
  EXPECT_EQ(c.scheduler.warmup_num_steps, 0);
  EXPECT_EQ(c.scheduler.total_num_steps, 0);  // the run's steps
  // The default custom GPT-2's hidden size is its 64 channels.
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 64 * 64);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 3686);  // 0.9 * 64²
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 640);
}

TEST(AutoValuesTest, BucketSizesFollowThePresetsHiddenSize) {
  const TrainConfig c = parse_ok(kAllAuto, {"model.preset=d12"});
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 768 * 768);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 530'841);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 7680);
  const TrainConfig mlp = parse_ok(kAllAuto, {"model.type=mlp", "data.source=blobs"});
  EXPECT_EQ(mlp.zero_optimization.reduce_bucket_size, 64 * 64);  // the widest of [16, 64, 64, 4]
}

TEST(AutoValuesTest, AutoBatchKeysAreDerivedFromTheOthers) {
  expect_plan(resolve_batch(parse_ok(kAllAuto, {"gradient_accumulation_steps=4"}), 4), 128, kAutoMicroBatch, 4);
  expect_plan(resolve_batch(parse_ok(kAllAuto, {"train_batch_size=64"}), 4), 64, 16, 1);
  expect_plan(resolve_batch(parse_ok(kAllAuto, {"train_micro_batch_size_per_gpu=2"}), 2), 4, 2, 1);
}

TEST(AutoValuesTest, KeysAutoCannotFillAreListedInOneMessageWithTheirDefaults) {
  EXPECT_EQ(parse_error(kMinimal,
                        {"zero_optimization.stage=auto", "optimizer.type=auto", "steps=auto", "fp16.loss_scale=auto"}),
            "zero has no value for \"auto\" (the Hugging Face Trainer's placeholder) in 4 keys; write a value for "
            "each, or remove it for the default shown: fp16.loss_scale (0.0), optimizer.type (\"AdamW\"), steps "
            "(300), zero_optimization.stage (0)");
}

TEST(AutoValuesTest, AutoInAKeyThatTakesAnyValueAsksForNothing) {
  parse_ok(kMinimal, {"zero_optimization.stage3_gather_16bit_weights_on_model_save=auto", "amp.opt_level=auto",
                      "amp.enabled=auto"});
}

TEST(AutoValuesTest, CheckpointResumeAutoIsZerosOwnValueAndStays) {
  EXPECT_EQ(parse_ok(kMinimal, {"checkpoint.dir=ckpt", "checkpoint.resume=auto"}).checkpoint.resume, "auto");
}

TEST(AutoValuesTest, AutoInAnUnknownKeyIsAnUnknownKey) {
  EXPECT_EQ(parse_error(kMinimal, {"gradient_cliping=auto"}),
            "unknown key 'gradient_cliping'; did you mean 'gradient_clipping'?");
  EXPECT_THAT(parse_error(kMinimal, {"scheduler=auto"}), HasSubstr("scheduler: expected an object, got \"auto\""));
}

const BatchPlan kOneStep{.train_batch_size = 4, .micro_batch = 1, .accumulation_steps = 1};
const std::vector<UnitSize> kUnits = {{"embedding", 4000}, {"h.0", 10'000}, {"head", 200}};

ZeroConfig engine_config_ok(const std::vector<std::string>& overrides) {
  const absl::StatusOr<ZeroConfig> z = engine_config(parse_ok(kMinimal, overrides), kOneStep, 4, kUnits);
  EXPECT_TRUE(z.ok()) << z.status();
  return z.ok() ? *z : ZeroConfig{};
}

TEST(EngineConfigTest, NvmeOffloadOfTheOptimizerReachesTheEngine) {
  EXPECT_EQ(engine_config_ok({}).offload_optimizer_path, "");
  const ZeroConfig z = engine_config_ok(
      {"zero_optimization.offload_optimizer.device=nvme", "zero_optimization.offload_optimizer.nvme_path=/local_nvme"});
  EXPECT_EQ(z.offload_optimizer_path, "/local_nvme");
  EXPECT_EQ(z.optimizer_swap.buffer_count, 4) << "DeepSpeed's defaults: one unit at a time, no pipeline";
  EXPECT_FALSE(z.optimizer_swap.pipeline_read || z.optimizer_swap.pipeline_write);
}

TEST(EngineConfigTest, DeepSpeedsSwapperKeysPaceTheOptimizersTransfers) {
  const ZeroConfig z = engine_config_ok(
      {"zero_optimization.offload_optimizer.device=nvme", "zero_optimization.offload_optimizer.nvme_path=/local_nvme",
       "zero_optimization.offload_optimizer.buffer_count=9", "zero_optimization.offload_optimizer.pipeline_read=true",
       "zero_optimization.offload_optimizer.pipeline_write=true"});
  EXPECT_EQ(z.optimizer_swap.buffer_count, 9);
  EXPECT_TRUE(z.optimizer_swap.pipeline_read);
  EXPECT_TRUE(z.optimizer_swap.pipeline_write);
}

TEST(EngineConfigTest, NvmeOffloadOfTheParametersReachesTheEngineAtStage3Only) {
  const std::vector<std::string> offload = {"zero_optimization.offload_param.device=nvme",
                                            "zero_optimization.offload_param.nvme_path=/local_nvme"};
  std::vector<std::string> stage3 = offload;
  stage3.push_back("zero_optimization.stage=3");
  EXPECT_EQ(engine_config_ok(stage3).offload_param_path, "/local_nvme");
  std::vector<std::string> stage2 = offload;
  stage2.push_back("zero_optimization.stage=2");
  const std::string message = parse_error(kMinimal, stage2);
  EXPECT_THAT(message, HasSubstr("zero_optimization.offload_param.device = nvme"));
  EXPECT_THAT(message, HasSubstr("stage 2 keeps every parameter whole; use zero_optimization.stage = 3"));
}

// A budget below what the device holds names the device's states alone; what offload put in host memory is named
// as outside the budget.
TEST(EngineConfigTest, ABudgetRefusalNamesWhatOffloadKeepsInHostMemory) {
  const auto refusal = [](const std::vector<std::string>& offload) {
    std::vector<std::string> overrides = {"device=sim", "zero_optimization.stage=3", "memory_budget_mib=1"};
    overrides.insert(overrides.end(), offload.begin(), offload.end());
    const TrainConfig c = parse_ok(kMinimal, overrides);
    const std::vector<UnitSize> big = {{"embedding", 400'000}, {"h.0", 1'000'000}, {"head", 20'000}};
    const absl::StatusOr<ZeroConfig> z = engine_config(c, kOneStep, 4, big, Device::sim(0));
    EXPECT_FALSE(z.ok());
    return std::string(z.status().message());
  };
  EXPECT_THAT(refusal({"zero_optimization.offload_optimizer.device=cpu"}),
              HasSubstr("(params 1.35 MiB, grads 1.35 MiB; the optimizer state and master weights in host memory, "
                        "outside the budget,"));
  EXPECT_THAT(refusal({"zero_optimization.offload_optimizer.device=cpu", "zero_optimization.offload_param.device=cpu"}),
              HasSubstr("(grads 1.35 MiB; the params, optimizer state and master weights in host memory, outside the "
                        "budget,"));
}

TEST(EngineConfigTest, NoSyncAndWrapReachTheEngineAndNoSyncIsRefusedAtStage2) {
  const ZeroConfig z = engine_config_ok({"zero_optimization.no_sync=true", "zero_optimization.wrap_min_params=5000"});
  EXPECT_TRUE(z.no_sync);
  EXPECT_EQ(z.wrap_min_params, 5000);
  const absl::StatusOr<ZeroConfig> refused = engine_config(
      parse_ok(kMinimal, {"zero_optimization.no_sync=true", "zero_optimization.stage=2"}), kOneStep, 4, kUnits);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("zero_optimization.no_sync = true"));
}

TEST(EngineConfigTest, BucketElementsBecomeBytesOfTheTrainingDtype) {
  EXPECT_EQ(engine_config_ok({"zero_optimization.reduce_bucket_size=1000"}).bucket_cap_bytes, 4000);
  EXPECT_EQ(engine_config_ok({"zero_optimization.reduce_bucket_size=1000", "bf16.enabled=true"}).bucket_cap_bytes,
            2000);
  // The engine's first, smaller bucket never exceeds the cap.
  EXPECT_EQ(engine_config_ok({"zero_optimization.reduce_bucket_size=1000"}).first_bucket_cap_bytes, 4000);
}

TEST(EngineConfigTest, ReduceBucketSizeZeroReducesEveryUnitAlone) {
  const ZeroConfig z = engine_config_ok({"zero_optimization.reduce_bucket_size=0"});
  EXPECT_EQ(z.gradient_buckets({4000, 10'000, 200}), (std::vector<std::vector<int>>{{2}, {1}, {0}}));
  // DeepSpeed's default 5e8 packs all three into the first bucket (up to 1 MiB).
  EXPECT_EQ(engine_config_ok({}).gradient_buckets({4000, 10'000, 200}), (std::vector<std::vector<int>>{{2, 1, 0}}));
}

TEST(EngineConfigTest, PrefetchAndLiveParametersCountLargestSharedUnits) {
  // The largest sharded unit holds 10,000 elements: the unit in use plus two prefetched.
  const std::vector<std::string> stage3 = {"zero_optimization.stage=3",
                                           "zero_optimization.stage3_param_persistence_threshold=0"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), stage3.begin(), stage3.end());
    return engine_config_ok(more).max_live_units;
  };
  EXPECT_EQ(with({"zero_optimization.stage3_prefetch_bucket_size=25000"}), 3);
  EXPECT_EQ(with({"zero_optimization.stage3_prefetch_bucket_size=25000",
                  "zero_optimization.stage3_max_live_parameters=20000"}),
            2);
  EXPECT_EQ(with({"zero_optimization.stage3_prefetch_bucket_size=25000", "zero_optimization.overlap_comm=false"}), 1);
  EXPECT_EQ(with({"zero_optimization.stage3_max_live_parameters=10"}), 1);  // the unit in use is always gathered
  EXPECT_EQ(with({}), 3);  // DeepSpeed's 5e7 prefetch: every unit, no more
}

TEST(EngineConfigTest, WallClockBreakdownTimesTheEnginesPhases) {
  EXPECT_TRUE(engine_config_ok({"wall_clock_breakdown=true"}).time_phases);
  EXPECT_FALSE(engine_config_ok({}).time_phases);
}

TEST(EngineConfigTest, CarriesPrecisionLossScalingAndAccumulation) {
  const ZeroConfig z =
      engine_config_ok({"fp16.enabled=true", "fp16.initial_scale_power=10", "fp16.loss_scale_window=50",
                        "gradient_clipping=2", "optimizer.params.weight_decay=0.1"});
  EXPECT_EQ(z.precision, DType::kF16);
  EXPECT_EQ(z.loss_scaling.initial_scale, 1024.0);
  EXPECT_EQ(z.loss_scaling.window, 50);
  EXPECT_EQ(z.loss_scaling.static_scale, 0.0);
  EXPECT_EQ(z.gradient_clipping, 2.0);
  EXPECT_FLOAT_EQ(z.weight_decay, 0.1f);
}

TEST(EngineConfigTest, BudgetBelowModelStatesAndOneGatheredUnitIsRefused) {
  // 14,200 parameters, fp32 AdamW, stage 3 on 4 ranks: 16 B x 3,550 = 56,800 B of states plus h.0 gathered
  // (40,000 B) is under 1 MiB, so 1 MiB fits; a model 100 times larger does not.
  TrainConfig c = parse_ok(kMinimal, {"zero_optimization.stage=3", "memory_budget_mib=1"});
  EXPECT_TRUE(engine_config(c, kOneStep, 4, kUnits).ok());
  const std::vector<UnitSize> large = {{"embedding", 400'000}, {"h.0", 1'000'000}, {"head", 20'000}};
  const absl::StatusOr<ZeroConfig> z = engine_config(c, kOneStep, 4, large);
  ASSERT_FALSE(z.ok());
  EXPECT_THAT(z.status().message(), AllOf(HasSubstr("memory_budget_mib = 1"), HasSubstr("unit 'h.0' gathered")));
}

TEST(EngineConfigTest, BudgetMustAlsoHoldTheLargestGradientBucket) {
  // 1.42M parameters, fp32 AdamW, stage 0 on 4 ranks: 22,720,000 B of model states fit in 24 MiB
  // (25,165,824 B), but not beside the bucket of h.0 and the embedding (1.4M elements, 5,600,000 B) that
  // the engine fills after the head's first bucket.
  const std::vector<UnitSize> units = {{"embedding", 400'000}, {"h.0", 1'000'000}, {"head", 20'000}};
  const absl::StatusOr<ZeroConfig> refused =
      engine_config(parse_ok(kMinimal, {"memory_budget_mib=24"}), kOneStep, 4, units);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_EQ(refused.status().message(),
            "memory_budget_mib = 24: a rank needs 27.01 MiB before any activation at stage 0 on 4 ranks (params "
            "5.42 MiB, grads 5.42 MiB, optimizer state 10.83 MiB, master weights 0 B, largest gradient bucket "
            "5.34 MiB); raise the budget, the stage or the ranks");
  EXPECT_TRUE(engine_config(parse_ok(kMinimal, {"memory_budget_mib=28"}), kOneStep, 4, units).ok());
  // Stages 1-3 reduce-scatter one unit per bucket: h.0 alone, beside its gathered copy at stage 3.
  const absl::StatusOr<ZeroConfig> stage3 =
      engine_config(parse_ok(kMinimal, {"zero_optimization.stage=3", "memory_budget_mib=12"}), kOneStep, 4, units);
  ASSERT_FALSE(stage3.ok());
  EXPECT_THAT(stage3.status().message(),
              AllOf(HasSubstr("unit 'h.0' gathered 3.81 MiB, largest gradient bucket 3.81 MiB"),
                    HasSubstr("a rank needs 13.05 MiB")));
}

// --- Real configs (tests/fixtures/deepspeed_configs/README.md): each loads, or is refused naming why ------

absl::StatusOr<TrainConfig> parse_fixture(const std::string& name, const std::vector<std::string>& overrides = {}) {
  std::ifstream file(std::string(ZERO_FIXTURES_DIR "/deepspeed_configs/") + name);
  EXPECT_TRUE(file) << name;
  std::stringstream text;
  text << file.rdbuf();
  return parse_train_config(text.str(), overrides);
}

// The fixture as zero-train settles it: the config, the batch for its ranks, and the engine's knobs.
TrainConfig load_fixture(const std::string& name, const std::vector<std::string>& overrides = {}) {
  const absl::StatusOr<TrainConfig> c = parse_fixture(name, overrides);
  EXPECT_TRUE(c.ok()) << name << ": " << c.status();
  if (!c.ok()) return TrainConfig{};
  const absl::StatusOr<BatchPlan> batch = resolve_batch(*c, c->ranks);
  EXPECT_TRUE(batch.ok()) << name << ": " << batch.status();
  if (batch.ok()) {
    EXPECT_TRUE(engine_config(*c, *batch, c->ranks, kUnits).ok()) << name;
  }
  return *c;
}

std::string fixture_error(const std::string& name, const std::vector<std::string>& overrides = {}) {
  const absl::StatusOr<TrainConfig> c = parse_fixture(name, overrides);
  EXPECT_FALSE(c.ok()) << name;
  return std::string(c.status().message());
}

TEST(DeepSpeedConfigs, DeepSpeedExamplesZero2LoadsAsStage2InFp16) {
  const TrainConfig c = load_fixture("ds_zero2.json");
  EXPECT_EQ(c.zero_optimization.stage, 2);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  expect_plan(resolve_batch(c, 4), 32, 4, 2);
}

TEST(DeepSpeedConfigs, DeepSpeedExamplesZero3LoadsWithTheOldNameOfTheGatherFlag) {
  const TrainConfig c = load_fixture("ds_zero3.json");
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(c.scheduler.total_num_steps, 10'000);
}

TEST(DeepSpeedConfigs, DeepSpeedExamplesFp16LoadsAtStage0WithItsLossScaling) {
  const TrainConfig c = load_fixture("ds_fp16.json");
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_EQ(c.fp16.initial_scale_power, 15);
  EXPECT_EQ(c.fp16.loss_scale_window, 500);
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.8, 0.999}));
}

TEST(DeepSpeedConfigs, Bf16ConfigLoadsWithItsCosineSchedule) {
  const TrainConfig c = load_fixture("ds_bf16.json");
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.scheduler.type, "WarmupCosineLR");
  expect_plan(resolve_batch(c, 4), 64, 8, 2);
}

TEST(DeepSpeedConfigs, ZeroInfinityLoadsWithParametersAndOptimizerOnNvme) {
  const TrainConfig c = load_fixture("ds_zero_infinity_nvme.json");
  EXPECT_EQ(c.zero_optimization.offload_param.device, "nvme");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.nvme_path, "/local_nvme");
}

TEST(DeepSpeedConfigs, BertLambLoadsAsFusedLambWithoutBiasCorrection) {
  const TrainConfig c = load_fixture("ds_bert_lamb.json");
  EXPECT_EQ(c.optimizer.type, "Lamb");
  EXPECT_FALSE(c.optimizer.bias_correction);
  EXPECT_EQ(c.optimizer.max_coeff, 0.3);
  EXPECT_EQ(c.optimizer.min_coeff, 0.01);
  expect_plan(resolve_batch(c, 4), 65536, 64, 256);
}

TEST(DeepSpeedConfigs, HfTrainerZero2OffloadsTheOptimizerOfADeviceEngineAndIsRefusedOnTheCpu) {
  const absl::StatusOr<TrainConfig> on_device = parse_fixture("hf_trainer_zero2.json", {"device=sim"});
  ASSERT_TRUE(on_device.ok()) << on_device.status();
  EXPECT_EQ(on_device->zero_optimization.offload_optimizer.device, "cpu");
  const absl::StatusOr<ZeroConfig> z = engine_config(*on_device, kOneStep, 4, kUnits, Device::sim(0));
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_TRUE(z->offload_optimizer_to_host);
  EXPECT_THAT(fixture_error("hf_trainer_zero2.json"),
              AllOf(HasSubstr("zero_optimization.offload_optimizer.device = cpu"),
                    HasSubstr("the engine is on the CPU (device = cpu)")));
  const TrainConfig c = load_fixture("hf_trainer_zero2.json", {"zero_optimization.offload_optimizer=null"});
  expect_plan(resolve_batch(c, 4), 4 * kAutoMicroBatch, kAutoMicroBatch, 1);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.scheduler.warmup_max_lr, c.optimizer.lr);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 200'000'000);  // the file's own value
}

TEST(DeepSpeedConfigs, HfTrainerZero3OffloadsOptimizerAndParametersOfADeviceEngineAndIsRefusedOnTheCpu) {
  const absl::StatusOr<TrainConfig> on_device = parse_fixture("hf_trainer_zero3.json", {"device=sim"});
  ASSERT_TRUE(on_device.ok()) << on_device.status();
  const absl::StatusOr<ZeroConfig> z = engine_config(*on_device, kOneStep, 4, kUnits, Device::sim(0));
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_TRUE(z->offload_optimizer_to_host);
  EXPECT_TRUE(z->offload_param_to_host);
  EXPECT_THAT(fixture_error("hf_trainer_zero3.json"), HasSubstr("offload_optimizer.device = cpu"));
  EXPECT_THAT(fixture_error("hf_trainer_zero3.json", {"zero_optimization.offload_optimizer=null"}),
              HasSubstr("offload_param.device = cpu"));
  // The shards go to the host beside the optimizer, which writes them there.
  EXPECT_THAT(fixture_error("hf_trainer_zero3.json", {"device=sim", "zero_optimization.offload_optimizer=null"}),
              AllOf(HasSubstr("offload_param.device = cpu"), HasSubstr("set offload_optimizer.device = cpu too")));
  const TrainConfig c = load_fixture(
      "hf_trainer_zero3.json", {"zero_optimization.offload_optimizer=null", "zero_optimization.offload_param=null"});
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 64 * 64);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 640);
  EXPECT_FALSE(c.fp16.enabled);
}

TEST(DeepSpeedConfigs, AccelerateZero2LoadsWithTorchAdamAndADecayToTheRunsEnd) {
  const TrainConfig c = load_fixture("accelerate_zero2.json");
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(c.scheduler.total_num_steps, 0);  // the run's steps
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 64 * 64);
}

TEST(DeepSpeedConfigs, AccelerateZero3LoadsWithAnAutoGatherFlag) {
  const TrainConfig c = load_fixture("accelerate_zero3.json");
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_FALSE(c.bf16);
  expect_plan(resolve_batch(c, 4), 4 * kAutoMicroBatch, kAutoMicroBatch, 1);
}

float lr_at(const std::vector<std::string>& overrides, int64_t step) {
  const TrainConfig c = parse_ok(kMinimal, overrides);
  return LrSchedule(c.scheduler, c.optimizer.lr, c.steps).lr(step);
}

TEST(LrScheduleTest, FollowsDeepSpeedsFormulas) {
  const std::vector<std::string> linear = {"scheduler.params.warmup_min_lr=0.1", "scheduler.params.warmup_max_lr=0.5",
                                           "scheduler.params.warmup_num_steps=10",
                                           "scheduler.params.warmup_type=linear"};
  auto plus = [](std::vector<std::string> a, std::vector<std::string> b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const auto warmup_lr = plus(linear, {"scheduler.type=WarmupLR"});
  EXPECT_FLOAT_EQ(lr_at(warmup_lr, 1), 0.1f);             // i = 0: the warmup's start
  EXPECT_FLOAT_EQ(lr_at(warmup_lr, 6), 0.1f + 0.4f / 2);  // i = 5 of 10
  EXPECT_FLOAT_EQ(lr_at(warmup_lr, 50), 0.5f);
  const auto decay = plus(linear, {"scheduler.type=WarmupDecayLR", "scheduler.params.total_num_steps=30"});
  EXPECT_FLOAT_EQ(lr_at(decay, 21), 0.1f + 0.4f * (30 - 20) / 20);  // i = 20: (total - i) / (total - W)
  EXPECT_FLOAT_EQ(lr_at(decay, 40), 0.1f);
  const std::vector<std::string> log_warmup = {"scheduler.type=WarmupLR", "scheduler.params.warmup_max_lr=1",
                                               "scheduler.params.warmup_num_steps=100"};
  EXPECT_FLOAT_EQ(lr_at(log_warmup, 10), static_cast<float>(std::log(10.0) / std::log(100.0)));
  const std::vector<std::string> cosine = {
      "scheduler.type=WarmupCosineLR",        "optimizer.params.lr=2",
      "scheduler.params.warmup_num_steps=10", "scheduler.params.total_num_steps=30",
      "scheduler.params.cos_min_ratio=0",     "scheduler.params.warmup_type=linear"};
  EXPECT_FLOAT_EQ(lr_at(cosine, 6), 1.0f);   // half the warmup of lr 2
  EXPECT_FLOAT_EQ(lr_at(cosine, 20), 1.0f);  // i = 19: (19 - 10 + 1) / 20 of the cosine, its midpoint
  EXPECT_FLOAT_EQ(lr_at({"optimizer.params.lr=0.25"}, 7), 0.25f);  // no scheduler: the optimizer's lr
}

}  // namespace
}  // namespace zero::train

namespace zero::train {
namespace {

// --- Bad input that used to crash or pass silently -----------------------------------------------------

TEST(TrainConfigBadInput, ANumberBeyondDoubleIsAnErrorNotACrash) {
  EXPECT_EQ(parse_error(R"({"train_micro_batch_size_per_gpu": 2, "steps": 1e400})"),
            "the config holds a value JSON cannot carry: number overflow parsing '1e400'");
}

TEST(TrainConfigBadInput, AKeyGivenTwiceIsRefusedNamingItsPath) {
  EXPECT_EQ(parse_error(R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1, "stage": 3}})"),
            "the config sets zero_optimization.stage twice; JSON keeps only the last, so remove one");
  EXPECT_EQ(parse_error(R"({"train_micro_batch_size_per_gpu": 2, "steps": 3, "steps": 4})"),
            "the config sets steps twice; JSON keeps only the last, so remove one");
  parse_ok(R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": false}, "fp16": {"enabled": false}})");
}

TEST(TrainConfigBadInput, LocalRanksAndTheBudgetAreBoundedNamingTheKey) {
  EXPECT_THAT(parse_error(kMinimal, {"ranks=100000"}),
              AllOf(HasSubstr("ranks = 100000"), HasSubstr("at most 1024"), HasSubstr("mpirun --backend=mpi")));
  parse_ok(kMinimal, {"ranks=100000", "backend=mpi"});  // under mpirun -np is the world size
  EXPECT_THAT(parse_error(kMinimal, {"memory_budget_mib=99999999999999"}),
              HasSubstr("memory_budget_mib = 99999999999999: is more bytes than an int64 counts"));
}

TEST(TrainConfigBadInput, AModelTheMachineCannotHoldIsRefusedBeforeItIsBuilt) {
  const TrainConfig c = parse_ok(kMinimal, {"zero_optimization.stage=3"});
  const Gpt2Config small = Gpt2Config::make(64, 13, 2, 4, 64);
  EXPECT_TRUE(check_machine_holds(c, small, 4, 4, int64_t{1} << 30).ok());
  // 10^9 blocks of 12·64² + 13·64 parameters (5.0e13 in all), 16 bytes each over the 4 ranks at stage 3.
  const Gpt2Config deep = Gpt2Config::make(64, 13, 1'000'000'000, 4, 64);
  const absl::Status refused = check_machine_holds(c, deep, 4, 4, int64_t{24} << 30);
  EXPECT_TRUE(absl::IsInvalidArgument(refused));
  EXPECT_THAT(std::string(refused.message()),
              AllOf(HasSubstr("model.num_layers = 1000000000"), HasSubstr("5e+13 parameters"),
                    HasSubstr("727.36 TiB of host memory on the 4 rank(s) of this machine, which has 24.00 GiB")));
  // Stage 3 spreads the states over the world: 10^4 machines of one rank each hold it.
  EXPECT_TRUE(check_machine_holds(c, Gpt2Config::make(64, 13, 100'000, 4, 64), 10'000, 1, int64_t{24} << 30).ok());
  // A shape whose count overflows int64 is refused all the same.
  EXPECT_FALSE(check_machine_holds(c, Gpt2Config::make(64, 13, 2, 4, 4'000'000'000), 4, 4, int64_t{24} << 30).ok());
}

// On a GPU host memory holds no model states, unless ZeRO-Offload puts the optimizer's there: 12 of their 16 bytes
// per parameter (fp32 master weights and AdamW's state), and 8 more of page-locked transfer buffers (fp32).
TEST(TrainConfigBadInput, OnAGpuHostMemoryMustHoldWhatOffloadPutsThere) {
  const Gpt2Config deep = Gpt2Config::make(64, 13, 1'000'000'000, 4, 64);
  // Set after parsing, which refuses cuda in a build without CUDA.
  TrainConfig on_gpu = parse_ok(kMinimal, {"zero_optimization.stage=3"});
  on_gpu.device = "cuda";
  EXPECT_TRUE(check_machine_holds(on_gpu, deep, 4, 4, int64_t{24} << 30).ok());
  TrainConfig offloaded = on_gpu;
  offloaded.zero_optimization.offload_optimizer.device = "cpu";
  const absl::Status refused = check_machine_holds(offloaded, deep, 4, 4, int64_t{24} << 30);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("909.20 TiB of host memory on the 4 rank(s)"));
}

}  // namespace
}  // namespace zero::train
