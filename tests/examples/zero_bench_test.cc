// zero-bench: comm, kernels, offload, optim and stages run end to end on tiny sizes (tables, CSV, PNG, flag errors) and
// their pieces.

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "examples/bench/comm_bench.h"
#include "examples/bench/stages_bench.h"
#include "examples/common/result_table.h"
#include "models/gpt2_config.h"
#include "runtime/comm/local.h"
#include "runtime/device.h"
#include "runtime/status.h"
#include "tests/examples/run_program.h"
#include "tests/skip_without_gpu.h"
#include "tests/temp_dir.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::mpiexec_launcher;
using testing::RunResult;
using testing::ScopedTempDir;

RunResult run_bench(const std::string& args, const std::string& launcher = "") {
  return testing::run_program(ZERO_BENCH_BINARY, args, launcher);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The lines of `text` that are not comments, each split into fields by `split`.
template <typename Splitter>
std::vector<std::vector<std::string>> records(const std::string& text, Splitter split) {
  std::vector<std::vector<std::string>> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line[0] != '#') out.push_back(absl::StrSplit(line, split, absl::SkipEmpty()));
  }
  return out;
}

double number(const std::string& field) {
  double value = 0;
  EXPECT_TRUE(absl::SimpleAtod(field, &value)) << "'" << field << "' is not a number";
  return value;
}

const std::vector<std::string> kHeader = {"collective", "size",       "count",       "time_us",
                                          "algbw_GB/s", "busbw_GB/s", "memcpy_GB/s", "busbw/memcpy"};
// Two ranks: busbw/algbw is 2(N-1)/N = 1 for allreduce, (N-1)/N = 0.5 for reduce_scatter and allgather.
const std::vector<std::pair<std::string, double>> kFactorFor2Ranks = {
    {"allreduce", 1.0}, {"reduce_scatter", 0.5}, {"allgather", 0.5}, {"broadcast", 1.0}};
const std::vector<std::string> kSizes = {"16384", "65536"};

// Checks one (collective, size) row per request in order, a positive time, and busbw = algbw x factor
// within `tolerance` per unit of bandwidth (the printing precision).
void expect_rows(const std::vector<std::vector<std::string>>& rows, double tolerance) {
  ASSERT_EQ(rows.size(), kFactorFor2Ranks.size() * kSizes.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    ASSERT_EQ(row.size(), kHeader.size());
    const auto& [name, factor] = kFactorFor2Ranks[i / kSizes.size()];
    EXPECT_EQ(row[0], name);
    EXPECT_EQ(row[1], kSizes[i % kSizes.size()]);
    EXPECT_EQ(number(row[2]), number(row[1]) / 4) << "fp32 elements";
    // Bandwidths are printed to fixed decimals: on a loaded machine a small collective's can print as 0.
    EXPECT_GT(number(row[3]), 0) << "time_us of row " << i;
    EXPECT_GT(number(row[6]), 0) << "memcpy_GB/s of row " << i;
    for (size_t c : {4, 5, 7}) EXPECT_GE(number(row[c]), 0) << kHeader[c] << " of row " << i;
    const double algbw = number(row[4]), busbw = number(row[5]), memcpy = number(row[6]);
    EXPECT_NEAR(busbw, algbw * factor, tolerance * (1 + factor)) << name;
    EXPECT_NEAR(number(row[7]), busbw / memcpy, tolerance + busbw / memcpy * 1e-3) << name;
    EXPECT_NEAR(algbw, number(row[1]) / number(row[3]) / 1e3, tolerance + algbw * 1e-3) << "bytes / us / 1e3";
  }
}

class CommBenchRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir;
    result_ = new RunResult(
        run_bench(absl::StrCat("comm --ranks=2 --sizes=16K,64K --warmup=1 --iters=3 --csv=", csv_path())));
  }
  static void TearDownTestSuite() {
    delete result_;
    delete dir_;
  }
  static std::string csv_path() { return dir_->file("comm.csv"); }
  static ScopedTempDir* dir_;
  static RunResult* result_;
};
ScopedTempDir* CommBenchRun::dir_ = nullptr;
RunResult* CommBenchRun::result_ = nullptr;

TEST_F(CommBenchRun, ExitsCleanly) { EXPECT_EQ(result_->exit_code, 0) << result_->output; }

TEST_F(CommBenchRun, TableHasTheColumnsAndOneRowPerCollectiveAndSize) {
  const auto table = records(result_->output, ' ');
  ASSERT_FALSE(table.empty()) << result_->output;
  EXPECT_EQ(table[0], kHeader);
  expect_rows({table.begin() + 1, table.end()}, 0.0005);  // bandwidths print with 3 decimals or more
}

TEST_F(CommBenchRun, CsvHasTheSameColumnsAndRows) {
  const auto csv = records(read_file(csv_path()), ',');
  ASSERT_FALSE(csv.empty()) << "no CSV at " << csv_path();
  EXPECT_EQ(csv[0], kHeader);
  expect_rows({csv.begin() + 1, csv.end()}, 1e-6);
}

TEST_F(CommBenchRun, PrintsWhatRan) {
  EXPECT_THAT(result_->output, HasSubstr("# zero-bench comm: backend local, 2 ranks, fp32, warmup 1, iters 3"));
  EXPECT_THAT(result_->output, HasSubstr("# buffers: rank 0's on cpu; memcpy: rank 0's single-thread memcpy"));
}

TEST(CommBenchGpu, TwoLocalRanksOnOneGpuPrintOneRowPerCollectiveAndSize) {
  ZERO_SKIP_WITHOUT_GPU();
  const RunResult r = run_bench("comm --device=cuda --ranks=2 --sizes=16K,64K --warmup=1 --iters=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("# buffers: rank 0's on cuda:0; memcpy: rank 0's device-to-device copy"));
  const auto table = records(r.output, ' ');
  ASSERT_FALSE(table.empty()) << r.output;
  EXPECT_EQ(table[0], kHeader);
  expect_rows({table.begin() + 1, table.end()}, 0.0005);
}

TEST(CommBenchGpu, OneNcclRankOnItsGpuPrintsARowPerCollective) {
  ZERO_SKIP_WITHOUT_GPU();
#ifndef ZERO_HAS_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#else
  const RunResult r = run_bench("comm --backend=nccl --device=cuda --ranks=1 --sizes=16K --warmup=1 --iters=3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("# zero-bench comm: backend nccl, 1 ranks, fp32"));
  EXPECT_THAT(r.output, HasSubstr("# buffers: rank 0's on cuda:0"));
  EXPECT_EQ(records(r.output, ' ').size(), 5u) << "the header and one row per collective";
#endif
}

TEST(CommBenchMpi, TwoProcessesPrintOneRowPerCollectiveAndSize) {
#ifndef ZERO_HAS_MPI
  GTEST_SKIP() << "this build has no MPI";
#else
  const RunResult r =
      run_bench("comm --backend=mpi --sizes=16K,64K --warmup=1 --iters=3", mpiexec_launcher(ZERO_MPIEXEC, 2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("# zero-bench comm: backend mpi, 2 ranks, fp32"));
  const auto table = records(r.output, ' ');
  ASSERT_FALSE(table.empty()) << r.output;
  EXPECT_EQ(table[0], kHeader);
  expect_rows({table.begin() + 1, table.end()}, 0.0005);
#endif
}

// --- optim ---

TEST(OptimBench, PrintsZeroBesideTheMemoryBound) {
  // No PyTorch (--python=/bin/false), whatever this machine has: header, zero, bound.
  const RunResult r = run_bench("optim --numel=100000 --iters=1 --python=/bin/false");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = records(r.output, absl::ByString("  "));
  ASSERT_GE(rows.size(), 3u) << r.output;
  EXPECT_EQ(absl::StripAsciiWhitespace(rows[1][0]), "zero AdamW");
  EXPECT_EQ(rows[1][2], "1.00");
  EXPECT_THAT(rows[2][0], HasSubstr("memory bound (28 B/param)"));
  EXPECT_GT(number(rows[2][1]), 0);
}

TEST(OptimBench, NonPositiveNumelNamesTheFlag) {
  const RunResult r = run_bench("optim --numel=0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--numel: must be >= 1"));
}

TEST(BenchEnvironment, ACollectiveDeadlineThatIsNoPositiveNumberIsRefusedBeforeAnyBenchmark) {
  const RunResult r = run_bench("comm", "ZERO_COMM_TIMEOUT_S=inf");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("zero-bench: ZERO_COMM_TIMEOUT_S = 'inf': the collective deadline is a number"));
}

// --- kernels ---

// The CSV of `zero-bench kernels <args> --tokens=4 --warmup=0 --iters=1`, as rows of fields (header first).
std::vector<std::vector<std::string>> run_kernels_csv(const std::string& args) {
  const ScopedTempDir dir;
  const std::string csv = dir.file("kernels.csv");
  const RunResult r = run_bench(absl::StrCat("kernels --tokens=4 --warmup=0 --iters=1 --csv=", csv, " ", args));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("# zero-bench kernels: "));
  return records(read_file(csv), ',');
}

TEST(KernelsBench, EveryKernelHasPositiveRatesBesideItsBaseline) {
  const auto rows = run_kernels_csv("");
  ASSERT_FALSE(rows.empty());
  EXPECT_THAT(rows[0], ElementsAre("kernel", "shape", "time_us", "rate", "unit", "baseline", "baseline_rate", "ratio"));
  std::map<std::string, int> seen;
  for (size_t i = 1; i < rows.size(); ++i) {
    const auto& row = rows[i];
    ASSERT_EQ(row.size(), 8u) << row[0];
    ++seen[row[0]];
    EXPECT_THAT(row[4], ::testing::AnyOf("GFLOP/s", "GB/s")) << row[0];
    for (int c : {2, 3, 6, 7}) EXPECT_GT(number(row[c]), 0) << rows[0][c] << " of " << row[0];
    EXPECT_NEAR(number(row[7]), number(row[3]) / number(row[6]), 1e-6 * number(row[7])) << row[0];
  }
  EXPECT_EQ(seen["matmul_forward"], 2) << "both GPT-2 MLP shapes";
  EXPECT_EQ(seen["matmul_backward"], 2);
  for (const char* kernel : {"gelu_forward", "residual_backward", "cast_fp32_bf16_stochastic", "layernorm_backward",
                             "crossentropy", "attention_forward", "attention_backward"}) {
    EXPECT_EQ(seen[kernel], 1) << kernel;
  }
  EXPECT_EQ(rows.size(), 16u) << "header + 15 kernel rows";
}

TEST(KernelsBench, KernelsFlagPicksTheRows) {
  const auto rows = run_kernels_csv("--kernels=cast_fp32_bf16,matmul_forward");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[1][0], "matmul_forward");
  EXPECT_EQ(rows[1][1], "4x768x3072");
  EXPECT_EQ(rows[2][0], "matmul_forward");
  EXPECT_EQ(rows[3][0], "cast_fp32_bf16");
  EXPECT_EQ(rows[3][5], "memcpy");
}

TEST(KernelsBench, UnknownKernelAndZeroTokensNameTheFlag) {
  RunResult r = run_bench("kernels --kernels=gelu_forward,gemm");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--kernels: unknown kernel 'gemm'; choose from all, matmul_forward"));
  r = run_bench("kernels --tokens=0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--tokens: 0 rows requested"));
}

// --- stages ---

// A CSV file's rows as column name -> field.
std::vector<std::map<std::string, std::string>> csv_rows(const std::string& path) {
  const auto lines = records(read_file(path), ',');
  std::vector<std::map<std::string, std::string>> rows;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::map<std::string, std::string>& row = rows.emplace_back();
    for (size_t c = 0; c < lines[0].size() && c < lines[i].size(); ++c) row[lines[0][c]] = lines[i][c];
  }
  return rows;
}

class StagesBenchRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir;
    result_ = new RunResult(run_bench(
        absl::StrCat("stages --model=tiny --ranks=3 --batch=2 --seq=8 --warmup=1 --iters=1 --csv=", csv_path())));
  }
  static void TearDownTestSuite() {
    delete result_;
    delete dir_;
  }
  static std::string csv_path() { return dir_->file("stages.csv"); }
  static ScopedTempDir* dir_;
  static RunResult* result_;
};
ScopedTempDir* StagesBenchRun::dir_ = nullptr;
RunResult* StagesBenchRun::result_ = nullptr;

TEST_F(StagesBenchRun, OneRowPerStageWithModelStateEqualToTheFormula) {
  ASSERT_EQ(result_->exit_code, 0) << result_->output;
  const auto rows = csv_rows(csv_path());
  ASSERT_EQ(rows.size(), 4u) << result_->output;
  for (int stage = 0; stage < 4; ++stage) {
    const auto& row = rows[stage];
    EXPECT_EQ(row.at("stage"), absl::StrCat(stage));
    EXPECT_GT(number(row.at("step_ms")), 0);
    EXPECT_GT(number(row.at("activ_MiB")), 0);
    EXPECT_LE(number(row.at("wait_ms")), number(row.at("step_ms")));
  }
  EXPECT_EQ(rows[0].at("vs_stage0"), "1");
  for (int stage = 0; stage < 3; ++stage) {
    EXPECT_EQ(rows[stage].at("state_MiB"), rows[stage].at("formula_MiB")) << "stage " << stage;
    EXPECT_EQ(rows[stage].at("sent_MiB"), rows[stage].at("theory_MiB")) << "stage " << stage;
  }
  // Every unit of tiny is below the persistence threshold (1e5 elements), so stage 3 keeps parameters
  // gathered: it holds and sends what stage 2 does, not the formula's sharded parameters.
  EXPECT_EQ(rows[3].at("state_MiB"), rows[2].at("state_MiB"));
  EXPECT_EQ(rows[3].at("sent_MiB"), rows[2].at("sent_MiB"));
  EXPECT_LT(number(rows[2].at("grads_MiB")), number(rows[1].at("grads_MiB")));
  EXPECT_LT(number(rows[1].at("optim_MiB")), number(rows[0].at("optim_MiB")));
}

TEST(StagesBench, Stage3WaitsOnItsGathersAndReductions) {
  // wait_ms comes from the engine's phase times: every stage-3 step waits on its allgathers and reduce-
  // scatters at least for the moment the collective takes, so it is never 0 when measured.
  StagesBenchOptions options{.model = Gpt2Config::preset("tiny").value(), .stages = {3}, .batch = 1, .seq_len = 8};
  options.reps = {.warmup = 0, .iters = 2};
  options.persistence_threshold = 0;  // every unit sharded, so gathered
  std::vector<double> wait_ms(2);
  const absl::Status status = root_cause(run_local_ranks(2, [&](Communicator& comm) -> absl::Status {
    ZERO_ASSIGN_OR_RETURN(const StageRow row, run_stage(comm, options, 3));
    wait_ms[comm.rank()] = row.wait_ms.value_or(0);
    return absl::OkStatus();
  }));
  ASSERT_TRUE(status.ok()) << status;
  for (double ms : wait_ms) EXPECT_GT(ms, 0);
}

TEST(StagesBench, RunsEveryStageOnTheSimulatedDevice) {
  const RunResult r = run_bench("stages --model=tiny --ranks=2 --batch=1 --seq=8 --warmup=0 --iters=1 --device=sim");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("on sim:0, backend local, 2 ranks"));
  for (int stage = 0; stage <= 3; ++stage) {
    EXPECT_THAT(r.output, ::testing::ContainsRegex(absl::StrCat("\n +", stage, " +[0-9.]+ +[0-9]+ ")));
  }
}

TEST(BenchFlags, Tf32NeedsCuda) {
  for (const char* device : {"cpu", "sim"}) {
    const RunResult r = run_bench(absl::StrCat("stages --model=tiny --seq=8 --tf32 --device=", device));
    EXPECT_EQ(r.exit_code, 1) << device;
    EXPECT_THAT(r.output, HasSubstr("--tf32: TF32 runs on CUDA's tensor cores: use it with --device=cuda")) << device;
    EXPECT_THAT(r.output, Not(HasSubstr("# zero-bench"))) << device;
  }
}

TEST(BenchFlags, DeviceIsCpuOrAVisibleGpuBeforeAnyRun) {
  for (const char* subcommand : {"comm", "stages"}) {
    RunResult r = run_bench(absl::StrCat(subcommand, " --device=tpu"));
    EXPECT_EQ(r.exit_code, 1) << subcommand;
    EXPECT_THAT(r.output, HasSubstr("--device: 'tpu' is not cpu, cuda or sim")) << subcommand;
    if (cuda_device_count() > 0) continue;
    // The reason after the colon is why_no_cuda_device()'s (no driver, or a build without CUDA).
    r = run_bench(absl::StrCat(subcommand, " --device=cuda"));
    EXPECT_EQ(r.exit_code, 1) << subcommand;
    EXPECT_THAT(r.output, AllOf(HasSubstr(absl::StrCat("--device: cuda needs a GPU: ", why_no_cuda_device())),
                                HasSubstr("or use --device=cpu")))
        << subcommand;
    EXPECT_THAT(r.output, Not(HasSubstr("# zero-bench"))) << subcommand;
  }
}

TEST(StagesBench, TorchPrintsPyTorchsStagesBesideZerosFromTheBaselinesLines) {
  // A stand-in for the Python: it prints what benchmarks/torch_stages.py prints, so the table is checked here
  // without PyTorch.
  const ScopedTempDir dir;
  const std::string python = dir.file("python");
  std::ofstream(python) << "#!/bin/sh\n"
                           "echo 'stage=0 wrapper=DDP step_ms=50.000 peak_rss_mib=700.0 torch=9.9.9'\n"
                           "echo 'stage=3 wrapper=FSDP(FULL_SHARD) step_ms=80.000 peak_rss_mib=650.0 torch=9.9.9'\n";
  std::filesystem::permissions(python, std::filesystem::perms::owner_exec, std::filesystem::perm_options::add);
  const RunResult r = run_bench(absl::StrCat(
      "stages --model=tiny --ranks=2 --batch=1 --seq=4 --warmup=0 --iters=1 --stages=0,3 --torch --python=", python));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("# PyTorch 9.9.9 beside zero: the same model, batch and 2 ranks"));
  EXPECT_THAT(r.output, ContainsRegex("\n +0 +[0-9.]+ +DDP +50\\.0 +[0-9.]+ +700\n"));
  EXPECT_THAT(r.output, ContainsRegex("\n +3 +[0-9.]+ +FSDP\\(FULL_SHARD\\) +80\\.0 +[0-9.]+ +650\n"));

  const RunResult missing = run_bench(
      "stages --model=tiny --ranks=2 --batch=1 --seq=4 --warmup=0 --iters=1 --stages=0 --torch --python=/bin/false");
  ASSERT_EQ(missing.exit_code, 0) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("# no PyTorch baseline: /bin/false -c 'import torch' fails"));
}

TEST(StagesBenchFlags, TorchRunsOnTheCpuInFp32) {
  const RunResult r = run_bench("stages --model=tiny --seq=4 --dtype=bf16 --torch");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--torch: PyTorch's stages run on the CPU in fp32"));
}

TEST(StagesBench, WritesAPngWithGnuplot) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot is not installed";
  const ScopedTempDir dir;
  const std::string png = dir.file("stages.png");
  const RunResult r =
      run_bench(absl::StrCat("stages --model=tiny --ranks=2 --batch=1 --seq=4 --warmup=0 --iters=1 "
                             "--stages=0,3 --png=",
                             png));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_file(png).substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST(OffloadBench, OffloadedRowsHoldWhatTheFormulaSaysInFiles) {
  const ScopedTempDir dir;  // holds the CSV and the offloaded files
  const std::string csv = dir.file("offload.csv");
  const RunResult r =
      run_bench(absl::StrCat("offload --model=tiny --ranks=2 --batch=1 --seq=4 --warmup=0 --iters=1 "
                             "--stages=0,3 --nvme_path=",
                             dir.path().string(), " --csv=", csv));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = csv_rows(csv);
  const std::vector<std::pair<std::string, std::string>> expected = {{"0", "none"},
                                                                     {"0", "files:optimizer"},
                                                                     {"0", "files:optimizer/pipelined"},
                                                                     {"3", "none"},
                                                                     {"3", "files:optimizer"},
                                                                     {"3", "files:optimizer/pipelined"},
                                                                     {"3", "files:optimizer+params/pipelined"}};
  ASSERT_EQ(rows.size(), expected.size()) << r.output;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    EXPECT_EQ(row.at("stage"), expected[i].first);
    EXPECT_EQ(row.at("offloaded"), expected[i].second);
    EXPECT_EQ(row.at("in_files_MiB"), row.at("formula_files_MiB")) << i;
    EXPECT_EQ(row.at("states_ram_MiB"), row.at("formula_MiB")) << i;
    EXPECT_GT(number(row.at("step_ms")), 0);
    // Each byte in files is read and written once a step; a plain write and read of them was timed beside.
    EXPECT_NEAR(number(row.at("moved_MiB")), 2 * number(row.at("in_files_MiB")), 0.02) << i;
    EXPECT_EQ(number(row.at("plain_ms")) > 0, number(row.at("moved_MiB")) > 0) << i;
  }
  EXPECT_EQ(number(rows[0].at("in_files_MiB")), 0);
  for (size_t i : {1, 4}) {
    EXPECT_LT(number(rows[i].at("states_ram_MiB")), number(rows[i - 1].at("states_ram_MiB")));
    // Pipelining changes when the bytes move, not where they live.
    EXPECT_EQ(rows[i + 1].at("states_ram_MiB"), rows[i].at("states_ram_MiB"));
    EXPECT_EQ(rows[i + 1].at("in_files_MiB"), rows[i].at("in_files_MiB"));
  }
  EXPECT_LT(number(rows[6].at("states_ram_MiB")), number(rows[5].at("states_ram_MiB")));
  EXPECT_GT(number(rows[6].at("in_files_MiB")), number(rows[5].at("in_files_MiB")));
}

TEST(OffloadBench, HostRowsOfADeviceEngineHoldWhatTheFormulaSaysOffTheDevice) {
  const ScopedTempDir dir;
  const std::string csv = dir.file("offload.csv");
  const RunResult r = run_bench(absl::StrCat(
      "offload --model=tiny --device=sim --ranks=2 --batch=1 --seq=4 --warmup=0 --iters=1 --stages=0,3 --csv=", csv));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = csv_rows(csv);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"0", "none"}, {"0", "host:optimizer"}, {"3", "none"}, {"3", "host:optimizer"}, {"3", "host:optimizer+params"}};
  ASSERT_EQ(rows.size(), expected.size()) << r.output;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    EXPECT_EQ(row.at("stage"), expected[i].first);
    EXPECT_EQ(row.at("offloaded"), expected[i].second);
    EXPECT_EQ(row.at("states_ram_MiB"), row.at("formula_MiB")) << i;
    EXPECT_EQ(number(row.at("in_files_MiB")), 0) << i;
    const bool host = i != 0 && i != 2;
    EXPECT_EQ(number(row.at("rank0_pinned_MiB")) > 0, host) << i;  // the transfer buffers
    EXPECT_EQ(number(row.at("moved_MiB")) > 0, host) << i;
    EXPECT_EQ(number(row.at("plain_ms")) > 0, host) << i;
  }
  // What goes to the host leaves the device: the optimizer, then the parameter shards too.
  for (size_t i : {1, 3}) EXPECT_LT(number(rows[i].at("rank0_device_MiB")), number(rows[i - 1].at("rank0_device_MiB")));
  EXPECT_LT(number(rows[4].at("rank0_device_MiB")), number(rows[3].at("rank0_device_MiB")));
}

TEST(StagesBenchFlags, BadStageAndModelNameTheFlag) {
  RunResult r = run_bench("stages --stages=0,4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--stages: '4' is not a ZeRO stage"));
  r = run_bench("stages --model=gpt5");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--model: 'gpt5'"));
  r = run_bench("stages --model=tiny --seq=17");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--seq: 17 exceeds the model's maxT 16"));
}

// A bad flag: exit 1 before any rank starts, the message naming the flag.
struct BadFlag {
  const char* args;
  const char* message;
};

class CommBenchBadFlag : public ::testing::TestWithParam<BadFlag> {};

TEST_P(CommBenchBadFlag, ExitsOneNamingTheFlag) {
  const RunResult r = run_bench(GetParam().args);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr(GetParam().message));
  EXPECT_THAT(r.output, Not(HasSubstr("# zero-bench")));
}

INSTANTIATE_TEST_SUITE_P(
    CommBenchFlags, CommBenchBadFlag,
    ::testing::Values(BadFlag{"comm --collectives=allreduce,alltoall", "--collectives: unknown collective 'alltoall'"},
                      BadFlag{"comm --sizes=4K,0", "--sizes: '0' is not a positive byte count"},
                      BadFlag{"comm --ranks=0", "--ranks: 0 ranks requested"},
                      BadFlag{"comm --dtype=fp64", "--dtype: unknown dtype 'fp64'"},
                      BadFlag{"comm --backend=gloo", "--backend: unknown backend 'gloo'; use local, mpi or nccl"}));

TEST(CommBenchFlags, MpiBackendWithoutMpiNamesTheFlag) {
#ifdef ZERO_HAS_MPI
  GTEST_SKIP() << "this build has MPI";
#else
  const RunResult r = run_bench("comm --backend=mpi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--backend: mpi: this zero-bench was built without MPI"));
#endif
}

TEST(CommBenchFlags, NcclBackendNeedsABuildWithNcclAndTheGpu) {
  const RunResult r = run_bench("comm --backend=nccl --device=cpu");
  EXPECT_EQ(r.exit_code, 1);
#ifdef ZERO_HAS_NCCL
  EXPECT_THAT(r.output,
              HasSubstr("--backend: nccl runs every rank on a GPU, but --device is 'cpu'; add --device=cuda"));
#else
  EXPECT_THAT(r.output, HasSubstr("--backend: nccl: this zero-bench was built without NCCL"));
#endif
  EXPECT_THAT(r.output, Not(HasSubstr("# zero-bench")));
}

TEST(CommBenchFlags, NcclBackendWithoutAGpuNamesTheDeviceFlag) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is visible";
  const RunResult r = run_bench("comm --backend=nccl --device=cuda --ranks=1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("--device: cuda needs a GPU"));
}

TEST(CommBenchFlags, UnknownSubcommandIsAUsageError) {
  const RunResult r = run_bench("bandwidth");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown subcommand 'bandwidth'"));
}

TEST(CommBenchFlags, HelpExplainsEveryFlag) {
  const RunResult r = run_bench("--help");
  for (const char* flag : {"--backend", "--ranks", "--device", "--dtype", "--warmup", "--iters", "--csv",
                           "--collectives", "--sizes", "--kernels", "--tokens"}) {
    EXPECT_THAT(r.output, HasSubstr(absl::StrCat("    ", flag, " ("))) << flag;
  }
  EXPECT_THAT(r.output, HasSubstr("comm  collective time"));
}

TEST(ParseSizeList, AcceptsPowerOf1024Suffixes) {
  EXPECT_THAT(*parse_size_list("4096,4K,1m,2G"), ElementsAre(4096, 4096, int64_t{1} << 20, int64_t{2} << 30));
}

TEST(ParseSizeList, RejectsGarbage) {
  EXPECT_THAT(parse_size_list("4K,12Q").status().message(), HasSubstr("'12Q' is not a positive byte count"));
}

TEST(BusBandwidthFactor, FollowsNcclTests) {
  EXPECT_EQ(bus_bandwidth_factor(CollectiveOp::kAllreduce, 4), 1.5);
  EXPECT_EQ(bus_bandwidth_factor(CollectiveOp::kReduceScatter, 4), 0.75);
  EXPECT_EQ(bus_bandwidth_factor(CollectiveOp::kAllgather, 4), 0.75);
  EXPECT_EQ(bus_bandwidth_factor(CollectiveOp::kBroadcast, 4), 1.0);
  EXPECT_EQ(bus_bandwidth_factor(CollectiveOp::kAllreduce, 1), 0.0);
}

TEST(ShapeCollective, RoundsChunkedPayloadsDownToNEqualChunks) {
  const Collective c = *shape_collective(CollectiveOp::kAllgather, 4096, DType::kF32, 3);
  EXPECT_EQ(c.count, 341);
  EXPECT_EQ(payload_bytes(c, 3), 4092);
}

TEST(ShapeCollective, KeepsWholeElementsForUnchunkedOps) {
  const Collective c = *shape_collective(CollectiveOp::kAllreduce, 4097, DType::kBF16, 3);
  EXPECT_EQ(c.count, 2048);
  EXPECT_EQ(payload_bytes(c, 3), 4096);
}

TEST(ShapeCollective, RejectsAPayloadSmallerThanOneElementPerRank) {
  EXPECT_THAT(shape_collective(CollectiveOp::kReduceScatter, 8, DType::kF32, 4).status().message(),
              HasSubstr("8 bytes is too small for reduce_scatter of fp32 on 4 ranks: it needs at least 16 bytes"));
}

TEST(ResultTable, AlignsTextAndQuotesCsv) {
  ResultTable table({{"name"}, {"n"}, {"x", 2}});
  table.add_row({std::string("a,b"), int64_t{12}, 0.125});
  EXPECT_EQ(table.to_text(), "   name   n     x\n  \"a,b\"  12  0.12\n");
  EXPECT_EQ(table.to_csv(), "name,n,x\n\"a,b\",12,0.125\n");
}

}  // namespace
}  // namespace zero
