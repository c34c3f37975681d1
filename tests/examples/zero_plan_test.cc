// zero-plan run end to end: its JSON and its table carry the plan's figures, and bad flags are refused by name.

#include <cstdio>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "models/gpt2.h"
#include "models/gpt2_config.h"
#include "nlohmann/json.hpp"
#include "tests/examples/run_program.h"

namespace zero {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::RunResult;

RunResult run_plan(const std::string& args) { return testing::run_program(ZERO_PLAN_BINARY, args); }

nlohmann::json run_json(const std::string& args) {
  const RunResult run = run_plan(absl::StrCat(args, " --json"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return nlohmann::json::parse(run.output);  // throws, failing the test, on anything but JSON
}

// The numbers of the table row whose first cell is `name`, e.g. "model states".
std::vector<double> table_row(const std::string& text, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), name + "  ")) continue;
    std::vector<double> values;
    for (absl::string_view cell : absl::StrSplit(line.substr(line.find(name) + name.size()), ' ', absl::SkipEmpty())) {
      double value = 0;
      EXPECT_TRUE(absl::SimpleAtod(cell, &value)) << "'" << cell << "' in: " << line;
      values.push_back(value);
    }
    return values;
  }
  ADD_FAILURE() << "no row '" << name << "' in:\n" << text;
  return {};
}

// Every parameter the GPT-2 of `config` declares, counted from its units' own specs (wte once: the head
// ties it rather than declaring it).
int64_t model_parameters(const Gpt2Config& config) {
  absl::StatusOr<std::unique_ptr<Gpt2>> model = Gpt2::create(config);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return -1;
  int64_t n = 0;
  for (Unit* unit : (*model)->units()) {
    for (const ParamSpec& spec : unit->param_specs()) n += shape_numel(spec.shape);
  }
  return n;
}

// ZeRO's 7.5B example on 64 ranks in bf16 with AdamW: 16Ψ, 4Ψ + 12Ψ/64, 2Ψ + 14Ψ/64, 16Ψ/64 bytes.
constexpr char kPaperExample[] = "--params 7.5e9 --ranks 64 --precision bf16";

TEST(ZeroPlan, JsonCarriesEveryStagesBytesAndTraffic) {
  const nlohmann::json plan = run_json(kPaperExample);
  EXPECT_EQ(plan["params"], 7'500'000'000);
  EXPECT_EQ(plan["world_size"], 64);
  ASSERT_EQ(plan["stages"].size(), 4u);
  std::vector<int64_t> totals, sent;
  for (const nlohmann::json& stage : plan["stages"]) {
    totals.push_back(stage["bytes"]["total"]);
    sent.push_back(stage["comm_bytes_per_step"]["total"]);
  }
  EXPECT_THAT(totals, ElementsAre(120'000'000'000, 31'406'250'000, 16'640'625'000, 1'875'000'000));
  // One ring pass of the bf16 model sends 2 bytes x Ψ/64 x 63 = 14,765,625,000 bytes: 2 passes, or 3 at stage 3.
  EXPECT_THAT(sent, ElementsAre(29'531'250'000, 29'531'250'000, 29'531'250'000, 44'296'875'000));
  const nlohmann::json& stage2 = plan["stages"][2]["bytes"];
  EXPECT_EQ(stage2["params"], 15'000'000'000);        // 2Ψ
  EXPECT_EQ(stage2["grads"], 234'375'000);            // 2Ψ/64
  EXPECT_EQ(stage2["master_weights"], 468'750'000);   // 4Ψ/64
  EXPECT_EQ(stage2["optimizer_state"], 937'500'000);  // 8Ψ/64
}

TEST(ZeroPlan, AdamHoldsWhatAdamWHolds) {
  // The ZeRO paper's optimizer: its two moments are AdamW's, so every figure is the same but the name.
  nlohmann::json adam = run_json(absl::StrCat(kPaperExample, " --optimizer adam"));
  nlohmann::json adamw = run_json(kPaperExample);
  ASSERT_EQ(adam["optimizer"], "adam");
  adam.erase("optimizer");
  adamw.erase("optimizer");
  EXPECT_EQ(adam, adamw);
}

TEST(ZeroPlan, TableShowsTheSameFiguresInTheChosenUnits) {
  RunResult run = run_plan(kPaperExample);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(table_row(run.output, "model states"), ElementsAre(120.0, 31.406, 16.641, 1.875));  // GB, 3 decimals
  run = run_plan(absl::StrCat(kPaperExample, " --units GiB"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // 120e9 / 2^30 = 111.7587..., 1.875e9 / 2^30 = 1.7462...
  EXPECT_THAT(table_row(run.output, "model states"), ElementsAre(111.759, 29.249, 15.498, 1.746));
}

TEST(ZeroPlan, MemoryBudgetGivesFitAndTheLargestModel) {
  const nlohmann::json plan = run_json(absl::StrCat(kPaperExample, " --memory 80GB"));
  EXPECT_EQ(plan["memory_bytes"], 80'000'000'000);
  std::vector<bool> fits;
  std::vector<int64_t> largest;
  for (const nlohmann::json& stage : plan["stages"]) {
    fits.push_back(stage["fits"]);
    largest.push_back(stage["largest_params_that_fit"]);
  }
  EXPECT_THAT(fits, ElementsAre(false, true, true, true));
  // Stage 0: 16Ψ <= 80e9. Stage 3: 16 bytes per ceil(Ψ/64) <= 80e9, so Ψ/64 <= 5e9.
  EXPECT_EQ(largest[0], 5'000'000'000);
  EXPECT_EQ(largest[3], 320'000'000'000);
}

TEST(ZeroPlan, Gpt2ModelAndActivations) {
  // d12, B = 4, T = 1024: BT = 4096, BTC = 3,145,728 floats. Per block saved 15BTC + 4BT + B·NH·T
  // = 47,251,456; head BTC + 2BT + BT·50304 (the logits, their gradient written over them) = 209,199,104;
  // outputs of embedding and 12 blocks 13BTC = 40,894,464. Saving: 40,894,464 + 12 x 47,251,456 + 209,199,104
  // = 817,111,040 floats; recomputing: 40,894,464 + max(209,199,104, 47,251,456) = 250,093,568 floats; 4 bytes each.
  const std::string args = "--model gpt2-124M --nodes 2 --gpus_per_node 4 --batch 4 --seq 1024";
  const nlohmann::json saving = run_json(args);
  EXPECT_EQ(saving["params"], 124'475'904);  // llm.c's count, wte with 50304 rows
  EXPECT_EQ(saving["world_size"], 8);
  EXPECT_EQ(saving["stages"][0]["bytes"]["activations"], 3'268'444'160);
  EXPECT_EQ(run_json(args + " --recompute")["stages"][3]["bytes"]["activations"], 1'000'374'272);
  const nlohmann::json& stage3 = saving["stages"][3]["bytes"];
  EXPECT_EQ(stage3["total"], stage3["model_states"].get<int64_t>() + 3'268'444'160);
  // bf16: 2 bytes for all but the fp32 statistics (4BT + B·NH·T = 65,536 floats a block, 2BT = 8,192 in the head).
  // Block 2 x 47,185,920 + 4 x 65,536 = 94,633,984 bytes; head 2 x 209,190,912 + 4 x 8,192 = 418,414,592; outputs
  // 2 x 40,894,464 = 81,788,928. Saving: 81,788,928 + 12 x 94,633,984 + 418,414,592; recomputing: the outputs and
  // the head.
  EXPECT_EQ(run_json(args + " --precision bf16")["stages"][0]["bytes"]["activations"], 1'635'811'328);
  EXPECT_EQ(run_json(args + " --precision bf16 --recompute")["stages"][3]["bytes"]["activations"], 500'203'520);
}

TEST(ZeroPlan, Gpt2ShapeFlagsCountTheModelsOwnParameters) {
  struct Case {
    std::string args;
    Gpt2Config config;
  };
  absl::StatusOr<Gpt2Config> d12 = Gpt2Config::preset("d12");
  ASSERT_TRUE(d12.ok());
  Gpt2Config d12_short = *d12;  // d12 with 6 layers, 4 heads of 192 and 2,000 positions
  d12_short.num_layers = 6;
  d12_short.num_heads = 4;
  d12_short.max_seq_len = 2000;
  const Case cases[] = {
      {"--model d12", *d12},
      {"--model d12 --num_layers 6 --num_heads 4 --max_seq_len 2000", d12_short},
      // No preset: the three sizes, with GPT-2's vocabulary and positions unless given.
      {"--num_layers 3 --num_heads 6 --channels 384", Gpt2Config::make(1024, 50257, 3, 6, 384)},
      {"--model custom --num_layers 5 --num_heads 5 --channels 320 --vocab_size 1000 --max_seq_len 77",
       Gpt2Config::make(77, 1000, 5, 5, 320)},
      // A vocabulary not a multiple of 128 gives wte padded rows, which zero-plan counts as the model allocates.
      {"--model tiny --vocab_size 300 --channels 48", Gpt2Config::make(16, 300, 2, 2, 48)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    ASSERT_TRUE(c.config.validate().ok());
    const int64_t expected = model_parameters(c.config);
    EXPECT_EQ(expected, c.config.num_parameters());
    const nlohmann::json plan = run_json(c.args + " --ranks 4 --stage 3");
    EXPECT_EQ(plan["params"], expected);
    const nlohmann::json& shape = plan["gpt2"];
    EXPECT_EQ(shape["num_layers"], c.config.num_layers);
    EXPECT_EQ(shape["num_heads"], c.config.num_heads);
    EXPECT_EQ(shape["channels"], c.config.channels);
    EXPECT_EQ(shape["vocab_size"], c.config.vocab_size);
    EXPECT_EQ(shape["padded_vocab_size"], c.config.padded_vocab_size);
    EXPECT_EQ(shape["max_seq_len"], c.config.max_seq_len);
    // The table's heading says the same count.
    const RunResult table = run_plan(c.args + " --ranks 4");
    ASSERT_EQ(table.exit_code, 0) << table.output;
    const std::string digits = absl::StrCat(expected);
    std::string commas;
    for (size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) commas.push_back(',');
      commas.push_back(digits[i]);
    }
    EXPECT_THAT(table.output, HasSubstr(absl::StrCat("\n", commas, " parameters"))) << table.output;
  }
  // The shape reaches the activations too: --seq is bounded by the --max_seq_len given.
  EXPECT_EQ(run_plan("--model tiny --max_seq_len 64 --ranks 2 --batch 1 --seq 64").exit_code, 0);
}

TEST(ZeroPlan, BadGpt2ShapesAreRefusedNamingTheFlag) {
  const std::pair<std::string, std::string> cases[] = {
      {"--model d12 --num_heads 7", "--num_heads: Gpt2Config.channels (768) must be a multiple of num_heads (7)"},
      {"--model d12 --channels 500", "--channels: Gpt2Config.channels (500) must be a multiple of num_heads (12)"},
      {"--num_layers 2 --num_heads 3 --channels 64", "--channels: Gpt2Config.channels (64) must be a multiple of"},
      {"--model d12 --num_layers 0", "--num_layers: Gpt2Config.num_layers is 0; it must be positive"},
      {"--model d12 --num_heads -2", "--num_heads: Gpt2Config.num_heads is -2; it must be positive"},
      {"--model tiny --vocab_size 0", "--vocab_size: Gpt2Config.vocab_size is 0; it must be positive"},
      {"--model tiny --max_seq_len 0", "--max_seq_len: Gpt2Config.max_seq_len is 0; it must be positive"},
      {"--model tiny --num_layers 1000000", "--num_layers: 1000000 is above the 100000 zero-plan plans for"},
      {"--model tiny --channels 9999999999", "--channels: 9999999999 is above the 2147483648"},
      {"--num_layers 2 --num_heads 4", "--channels: a custom GPT-2 shape (no --model preset) needs"},
      {"--model custom --num_heads 4 --channels 64", "--num_layers: a custom GPT-2 shape"},
      {"--params 1e9 --num_layers 4", "--num_layers: sets a GPT-2 shape, which --params replaces"},
      {"--model d12 --num_layers six", "'six' specified for flag 'num_layers'"},
  };
  for (const auto& [args, message] : cases) {
    const RunResult run = run_plan(args + " --ranks 8");
    EXPECT_NE(run.exit_code, 0) << args;
    EXPECT_THAT(run.output, HasSubstr(message)) << args;
  }
  EXPECT_THAT(run_plan("--model tiny --max_seq_len 8 --ranks 2 --batch 1 --seq 9").output,
              HasSubstr("--seq: 9 is outside 1 to the model's max_seq_len 8"));
}

TEST(ZeroPlan, MemoryWithoutAUnitIsRefusedAskingForOne) {
  for (const std::string memory : {"80", "80.5", "8e10"}) {
    const RunResult run = run_plan("--params 1e9 --ranks 8 --memory " + memory);
    EXPECT_NE(run.exit_code, 0) << memory;
    EXPECT_THAT(run.output, HasSubstr(absl::StrCat("--memory: '", memory, "' has no unit; add one, e.g. ", memory,
                                                   "GB or ", memory, "GiB")));
  }
  // With a unit it is read: bytes too, spelled B.
  EXPECT_EQ(run_json("--params 1e9 --ranks 8 --memory 80GiB")["memory_bytes"], int64_t{80} << 30);
  EXPECT_EQ(run_json("--params 1e9 --ranks 8 --memory 8e10B")["memory_bytes"], 80'000'000'000);
}

TEST(ZeroPlan, NodesTimesGpusIsTheSameAsRanks) {
  EXPECT_EQ(run_json("--model d24 --ranks 16")["stages"],
            run_json("--model d24 --nodes 4 --gpus_per_node 4")["stages"]);
}

TEST(ZeroPlan, OffloadMovesMasterWeightsAndOptimizerStateIntoFiles) {
  const nlohmann::json plan = run_json(absl::StrCat(kPaperExample, " --stage 2 --offload_optimizer nvme"));
  const nlohmann::json& bytes = plan["stages"][0]["bytes"];
  EXPECT_EQ(bytes["master_weights"], 0);
  EXPECT_EQ(bytes["optimizer_state"], 0);
  EXPECT_EQ(bytes["in_files"], 468'750'000 + 937'500'000);  // (4 + 8)Ψ/64
  EXPECT_EQ(bytes["total"], 15'000'000'000 + 234'375'000);  // 2Ψ + 2Ψ/64 left in RAM
}

// ZeRO-Offload: the device holds the bf16 params and gradient shard, the host the fp32 master weights and AdamW's
// state; the largest model that fits a device counts only what is on it.
TEST(ZeroPlan, HostOffloadKeepsMasterWeightsAndOptimizerStateInHostMemory) {
  const nlohmann::json plan = run_json(absl::StrCat(kPaperExample, " --stage 2 --offload_optimizer cpu --memory 80GB"));
  const nlohmann::json& stage = plan["stages"][0];
  EXPECT_EQ(stage["bytes"]["master_weights"], 468'750'000);         // 4Ψ/64, as without offload
  EXPECT_EQ(stage["bytes"]["on_host"], 468'750'000 + 937'500'000);  // (4 + 8)Ψ/64
  EXPECT_EQ(stage["bytes"]["model_states"], 15'000'000'000 + 234'375'000 + 468'750'000 + 937'500'000);
  // 80 GB holds 2Ψ + 2Ψ/64 of params and grads: Ψ = 80e9 / (2 + 2/64) = 39.38e9, where the device would
  // otherwise hold 2Ψ + 14Ψ/64 (Ψ = 36.06e9).
  const int64_t largest = stage["largest_params_that_fit"];
  EXPECT_NEAR(static_cast<double>(largest), 80e9 / (2 + 2.0 / 64), 64.0);
  const RunResult table = run_plan(absl::StrCat(kPaperExample, " --stage 2 --offload_optimizer cpu --memory 80GB"));
  ASSERT_EQ(table.exit_code, 0) << table.output;
  EXPECT_EQ(table_row(table.output, "in host memory"), std::vector<double>{1.406});  // GB
  EXPECT_THAT(table.output, HasSubstr("--memory is the device's"));
}

// One 80 GB GPU with 128 GB of host memory, bf16 + AdamW at stage 0: the device holds 4 bytes per parameter (20e9
// would fit) and the host 16, 12 of states and 4 of pinned transfer buffers (8e9), so the host decides.
TEST(ZeroPlan, HostMemoryBoundsTheLargestModelWithTheOptimizerOffloaded) {
  const nlohmann::json plan = run_json(
      "--params 1e9 --ranks 1 --stage 0 --precision bf16 --offload_optimizer cpu --memory 80GB --host_memory 128GB");
  const nlohmann::json& stage = plan["stages"][0];
  EXPECT_EQ(plan["host_memory_bytes"], 128'000'000'000);
  EXPECT_TRUE(stage["fits_host"]);
  EXPECT_EQ(stage["bytes"]["transfer_buffers"], 4'000'000'000);
  EXPECT_EQ(stage["largest_params_that_fit"], 128'000'000'000 / 16);
  // 8 ranks of a node share its host memory: 16 GB each for 16Ψ/8 at stage 2.
  const nlohmann::json node = run_json(
      "--params 1e9 --nodes 1 --gpus_per_node 8 --stage 2 --precision bf16 --offload_optimizer cpu --memory 80GB "
      "--host_memory 128GB");
  EXPECT_NEAR(static_cast<double>(node["stages"][0]["largest_params_that_fit"].get<int64_t>()), 16e9 / 2, 8.0);
}

// With the parameter shards in host memory too, stage 3's device holds the gradient shard alone: 2Ψ/64 of the paper's
// 7.5B on 64 GPUs, and the host the other 14Ψ/64.
TEST(ZeroPlan, HostOffloadOfStage3ParametersLeavesTheGradientShardOnTheDevice) {
  const nlohmann::json plan =
      run_json(absl::StrCat(kPaperExample, " --stage all --offload_optimizer cpu --offload_param cpu"));
  const nlohmann::json& stage3 = plan["stages"][3]["bytes"];
  EXPECT_EQ(stage3["on_host"], 234'375'000 + 468'750'000 + 937'500'000);  // (2 + 4 + 8)Ψ/64
  EXPECT_EQ(stage3["model_states"], 4 * 234'375'000 + 937'500'000);       // (2 + 2 + 4 + 8)Ψ/64
  const nlohmann::json& stage2 = plan["stages"][2]["bytes"];
  EXPECT_EQ(stage2["on_host"], 468'750'000 + 937'500'000);  // stages 0-2 keep their parameters on the device
}

TEST(ZeroPlan, OffloadingParametersMovesStage3ShardsIntoFilesAndLeavesStages0To2Alone) {
  const nlohmann::json plan =
      run_json(absl::StrCat(kPaperExample, " --stage all --offload_optimizer nvme --offload_param nvme"));
  const nlohmann::json& stage2 = plan["stages"][2]["bytes"];
  EXPECT_EQ(stage2["params"], 15'000'000'000);               // 2Ψ: whole on every rank
  EXPECT_EQ(stage2["in_files"], 468'750'000 + 937'500'000);  // (4 + 8)Ψ/64
  const nlohmann::json& stage3 = plan["stages"][3]["bytes"];
  EXPECT_EQ(stage3["params"], 0);
  EXPECT_EQ(stage3["in_files"], 234'375'000 + 468'750'000 + 937'500'000);  // (2 + 4 + 8)Ψ/64
  EXPECT_EQ(stage3["total"], 234'375'000);                                 // the gradient shard 2Ψ/64
}

TEST(ZeroPlan, BadFlagsExitNonZeroNamingTheFlag) {
  const std::pair<std::string, std::string> cases[] = {
      {"--params 1e9 --ranks 8 --stage 5", "--stage: '5' is not 0, 1, 2, 3 or all"},
      {"--params 1e9 --ranks 8 --precision fp8", "--precision: 'fp8'"},
      {"--params 1e9 --ranks 8 --optimizer lion", "--optimizer: 'lion'"},
      {"--params 1e9 --ranks 8 --offload_optimizer disk", "--offload_optimizer: 'disk' is not none, cpu or nvme"},
      {"--params 1e9 --ranks 8 --memory 80GB --host_memory 128GB",
       "--host_memory: counts what --offload_optimizer=cpu"},
      {"--params 1e9 --ranks 8 --stage 3 --offload_optimizer cpu --offload_param nvme",
       "--offload_param: nvme moves a CPU engine's parameter shards"},
      {"--params 1e9 --ranks 8 --stage 1 --offload_param nvme", "--offload_param: nvme moves the parameter shards"},
      {"--params 1e9 --ranks 8 --stage 3 --offload_param cpu", "--offload_param: cpu keeps the shards in host memory"},
      {"--params 1e9 --ranks 8 --memory 80XB", "--memory: unknown unit 'XB'"},
      {"--params 1e9 --ranks 8 --units furlongs", "--units: unknown unit 'furlongs'"},
      {"--params 1e9 --ranks 0", "--ranks: 0 is not a count >= 1"},
      {"--params 1e9", "--ranks: give either --ranks or --nodes"},
      {"--ranks 8", "--model: give exactly one of --model and --params"},
      {"--model d99 --ranks 8", "--model: unknown GPT-2 preset 'd99'"},
      {"--params 1e9 --ranks 8 --batch 4 --seq 64", "--batch: activations need a GPT-2 --model"},
      {"--model tiny --ranks 8 --batch 4 --seq 17", "--seq: 17 is outside 1 to the model's max_seq_len 16"},
      {"--params 1e9 --ranks 8 --bogus 1", "Unknown command line flag 'bogus'"},
      {"--params 1e9 --ranks eight", "'eight' specified for flag 'ranks'"},
  };
  for (const auto& [args, message] : cases) {
    const RunResult run = run_plan(args);
    EXPECT_NE(run.exit_code, 0) << args;
    EXPECT_THAT(run.output, HasSubstr(message)) << args;
  }
}

}  // namespace
}  // namespace zero
