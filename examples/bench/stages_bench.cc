#include "examples/bench/stages_bench.h"

#include <sched.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "examples/common/bench_python.h"
#include "examples/common/gnuplot.h"
#include "examples/common/median.h"
#include "models/data/device_batch.h"
#include "models/gpt2.h"
#include "optim/optimizers.h"
#include "runtime/cpu_threads.h"
#include "runtime/device.h"
#include "runtime/status.h"
#include "shard/plan.h"
#include "shard/stage.h"

ABSL_FLAG(std::string, model, "mini",
          "stages: the GPT-2 shape: mini (maxT 256, V 8192, L 4, NH 4, C 256: quick) or a preset (tiny, d12 = GPT-2 "
          "small 124M, d24, d36, d48)");
ABSL_FLAG(std::string, stages, "0,1,2,3", "stages: comma list of ZeRO stages to run, each from 0 to 3");
ABSL_FLAG(int64_t, batch, 4, "stages: sequences per rank per step (B)");
ABSL_FLAG(int64_t, seq, 64, "stages: tokens per sequence (T), at most the model's maxT");
ABSL_FLAG(bool, tf32, false, "stages: the models' fp32 GEMMs on tensor cores in TF32 (--device=cuda only)");
ABSL_FLAG(bool, torch, false,
          "stages: also run PyTorch's counterpart of each stage on the same model, batch and ranks (DDP, DDP + "
          "ZeroRedundancyOptimizer, FSDP SHARD_GRAD_OP, FSDP FULL_SHARD; gloo, one process per rank; "
          "benchmarks/torch_stages.py under --python) and print it beside zero's (CPU, fp32)");
ABSL_FLAG(std::string, png, "",
          "stages: also plot peak memory per category (stacked) and step time per stage to this PNG (needs gnuplot)");

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<Gpt2Config> gpt2_model_flag() {
  const std::string name = absl::GetFlag(FLAGS_model);
  if (name == "mini") return Gpt2Config::make(256, 8192, 4, 4, 256);
  absl::StatusOr<Gpt2Config> preset = Gpt2Config::preset(name);
  if (!preset.ok()) return flag_error("model", absl::StrCat("'", name, "' is not mini, tiny, d12, d24, d36 or d48"));
  return preset;
}

absl::StatusOr<std::vector<int>> stages_flag() {
  std::vector<int> stages;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_stages), ',')) {
    int stage = -1;
    if (!absl::SimpleAtoi(s, &stage) || !StagePolicy::valid(stage)) {
      return flag_error("stages", absl::StrCat("'", s, "' is not a ZeRO stage (0, 1, 2 or 3)"));
    }
    stages.push_back(stage);
  }
  return stages;
}

// This rank's micro-batch of step `step`: tokens uniform over the vocabulary, targets the next token.
struct TokenBatch {
  std::vector<int32_t> inputs, targets;
  Batch batch(int64_t B, int64_t T) {
    return {.inputs = Tensor(inputs.data(), DType::kI32, {B, T}),
            .targets = Tensor(targets.data(), DType::kI32, {B, T})};
  }
};
TokenBatch random_tokens(const StagesBenchOptions& o, int rank, int step) {
  std::mt19937 rng(static_cast<uint32_t>(step * 1009 + rank));
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(o.model.vocab_size) - 1);
  const int64_t n = o.batch * o.seq_len;
  std::vector<int32_t> stream(n + 1);
  for (int32_t& t : stream) t = token(rng);
  return {.inputs = {stream.begin(), stream.end() - 1}, .targets = {stream.begin() + 1, stream.end()}};
}

absl::Status barrier(Communicator& comm) { return comm.barrier().wait(); }

}  // namespace

absl::StatusOr<StageRow> run_stage(Communicator& comm, const StagesBenchOptions& o, int stage) {
  Allocator allocator(comm.rank());
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Gpt2> model, Gpt2::create(o.model));
  ZeroConfig config;
  config.stage = stage;
  config.precision = o.precision;
  config.offload_optimizer_path = o.offload_optimizer_path;
  config.offload_param_path = o.offload_param_path;
  config.optimizer_swap = o.optimizer_swap;
  config.offload_optimizer_to_host = o.offload_optimizer_to_host;
  config.offload_param_to_host = o.offload_param_to_host;
  config.persistence_threshold = o.persistence_threshold;
  config.device = rank_device(comm, o.device);
  config.tf32 = o.tf32;
  // On the CPU timing costs clock reads only; on a GPU it would synchronize the device between phases.
  config.time_phases = config.device.is_cpu();
  const OptimizerFactory adamw = [](ShardLayout layout, Allocator& alloc, Device device) {
    return make_adam(AdamOptions{}, std::move(layout), alloc, device);
  };
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(*model, comm, allocator, adamw, config));
  data::DeviceBatch on_device(allocator, config.device);
  const auto step = [&](int k) -> absl::Status {
    TokenBatch data = random_tokens(o, comm.rank(), k);
    ZERO_ASSIGN_OR_RETURN(const Batch batch, on_device.place(data.batch(o.batch, o.seq_len)));
    engine->reset_comm_volume();
    return engine->train_step({&batch, 1}, 1e-4f).status();
  };
  for (int k = 0; k < o.reps.warmup; ++k) ZERO_RETURN_IF_ERROR(step(k));
  ZERO_RETURN_IF_ERROR(barrier(comm));
  engine->reset_phase_times();
  std::vector<double> step_seconds;  // each the slowest rank's, through the barrier
  for (int k = 0; k < o.reps.iters; ++k) {
    const Clock::time_point start = Clock::now();
    ZERO_RETURN_IF_ERROR(step(o.reps.warmup + k));
    ZERO_RETURN_IF_ERROR(barrier(comm));
    step_seconds.push_back(seconds_since(start));
  }
  const double seconds = median(step_seconds);

  const PlanInput plan{.params = engine->num_params(),
                       .padded_params = engine->num_padded_params(),
                       .world_size = comm.world_size(),
                       .stage = stage,
                       .precision = o.precision,
                       .offload_optimizer = !o.offload_optimizer_path.empty(),
                       .offload_param = !o.offload_param_path.empty(),
                       .offload_optimizer_to_host = o.offload_optimizer_to_host,
                       .offload_param_to_host = o.offload_param_to_host};
  const MemoryStats held = allocator.stats();
  const ModelStateBytes bytes = model_state_bytes(plan);
  StageRow row{
      .stage = stage,
      .world_size = comm.world_size(),
      .step_ms = 1e3 * seconds,
      .tokens_per_s = static_cast<double>(comm.world_size() * o.batch * o.seq_len) / seconds,
      .wait_ms = config.time_phases
                     ? std::optional<double>(absl::ToDoubleMilliseconds(engine->phase_times().waiting) / o.reps.iters)
                     : std::nullopt,
      .formula_model_state = bytes.total(),
      .in_files = held.in_files_total(),
      .formula_in_files = bytes.in_files,
      .formula_offload_traffic =
          2 * bytes.in_files + bytes.transfer_buffers + (o.offload_param_to_host ? 2 * bytes.params : 0),
      .sent = engine->comm_volume(),
      .formula_sent = comm_bytes_per_step(plan).total(),
      .kept_for_reuse = held.cached};
  engine.reset();
  model.reset();
  row.memory = allocator.stats();
  return row;
}

int64_t StageRow::model_state_peak() const {
  return memory.peak_of(MemoryCategory::kParams) + memory.peak_of(MemoryCategory::kGrads) +
         memory.peak_of(MemoryCategory::kMasterWeights) + memory.peak_of(MemoryCategory::kOptimizerState);
}

namespace {

// gnuplot reads the CSV's columns by number; see stages_bench_table for the order.
constexpr absl::string_view kPlotScript = R"(set datafile separator ','
set terminal pngcairo noenhanced size 1200,480 font ',10'
set output '{png}'
set multiplot layout 1,2
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.6
set key outside right
set title 'Peak memory per category, rank 0 (stacked peaks)'
set ylabel 'MiB'
plot for [c=5:11] '{csv}' using c:xtic(sprintf('stage %d', column(1))) title columnhead(c)
set style histogram clustered
set title 'Step time'
set ylabel 'ms'
set yrange [0:*]
unset key
plot '{csv}' every ::1 using 2:xtic(sprintf('stage %d', column(1)))
unset multiplot
)";

absl::Status plot_png(const ResultTable& table, const std::string& png) {
  if (const absl::Status status = render_png(png, table.to_csv(), kPlotScript); !status.ok()) {
    return flag_error("png", status.message());
  }
  std::printf("# plot: %s (data %s.csv)\n", png.c_str(), png.c_str());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<StageRow>> run_stages_bench(Communicator& comm, const StagesBenchOptions& options) {
  std::vector<StageRow> rows;
  for (int stage : options.stages) {
    ZERO_ASSIGN_OR_RETURN(StageRow row, run_stage(comm, options, stage));
    rows.push_back(row);
  }
  return rows;
}

ResultTable stages_bench_table(const std::vector<StageRow>& rows) {
  ResultTable table({{"stage"},
                     {"step_ms", 1},
                     {"tokens/s", 0},
                     {"vs_stage0", 3},
                     {"params_MiB", 2},
                     {"grads_MiB", 2},
                     {"master_MiB", 2},
                     {"optim_MiB", 2},
                     {"comm_MiB", 2},
                     {"activ_MiB", 2},
                     {"work_MiB", 2},
                     {"state_MiB", 2},
                     {"formula_MiB", 2},
                     {"sent_MiB", 2},
                     {"theory_MiB", 2},
                     {"wait_ms", 1},
                     {"kept_MiB", 2}});
  const bool ddp_first = !rows.empty() && StagePolicy(rows[0].stage).updates_everything();  // stage 0
  const double stage0_ms = ddp_first ? rows[0].step_ms : 0;
  for (const StageRow& r : rows) {
    const MemoryStats& m = r.memory;
    table.add_row({int64_t{r.stage}, r.step_ms, r.tokens_per_s,
                   stage0_ms > 0 ? Cell(r.step_ms / stage0_ms) : Cell(std::string("-")),
                   mib(m.peak_of(MemoryCategory::kParams)), mib(m.peak_of(MemoryCategory::kGrads)),
                   mib(m.peak_of(MemoryCategory::kMasterWeights)), mib(m.peak_of(MemoryCategory::kOptimizerState)),
                   mib(m.peak_of(MemoryCategory::kCommBuffers)), mib(m.peak_of(MemoryCategory::kActivations)),
                   mib(m.peak_of(MemoryCategory::kWorkspace)), mib(r.model_state_peak()), mib(r.formula_model_state),
                   mib(r.sent.param_gather + r.sent.grad_reduce), mib(r.formula_sent),
                   r.wait_ms ? Cell(*r.wait_ms) : Cell(std::string("-")), mib(r.kept_for_reuse)});
  }
  return table;
}

absl::StatusOr<StagesBenchOptions> stages_options_from_flags() {
  StagesBenchOptions options;
  ZERO_ASSIGN_OR_RETURN(options.model, gpt2_model_flag());
  ZERO_ASSIGN_OR_RETURN(options.stages, stages_flag());
  options.batch = absl::GetFlag(FLAGS_batch);
  options.seq_len = absl::GetFlag(FLAGS_seq);
  if (options.batch < 1) return flag_error("batch", "must be >= 1");
  if (options.seq_len < 1) return flag_error("seq", "must be >= 1");
  if (options.seq_len > options.model.max_seq_len) {
    return flag_error("seq", absl::StrCat(options.seq_len, " exceeds the model's maxT ", options.model.max_seq_len));
  }
  ZERO_ASSIGN_OR_RETURN(options.precision, dtype_flag());
  ZERO_ASSIGN_OR_RETURN(options.device, device_flag());
  ZERO_ASSIGN_OR_RETURN(options.reps, repetitions_flags());
  options.tf32 = absl::GetFlag(FLAGS_tf32);
  if (options.tf32 && !options.device.is_cuda()) {
    return flag_error("tf32", "TF32 runs on CUDA's tensor cores: use it with --device=cuda");
  }
  if (options.tf32 && options.precision != DType::kF32) {
    return flag_error("tf32", "TF32 changes fp32 GEMMs only; a bf16/fp16 model computes its GEMMs in that precision");
  }
  options.torch = absl::GetFlag(FLAGS_torch);
  if (options.torch && (!options.device.is_cpu() || options.precision != DType::kF32)) {
    return flag_error("torch", "PyTorch's stages run on the CPU in fp32: use --device=cpu --dtype=fp32 with it");
  }
  return options;
}

std::string describe_model(const StagesBenchOptions& o) {
  const Gpt2Config& g = o.model;
  return absl::StrFormat("GPT-2 L%d C%d NH%d Vp%d (%d parameters), B %d, T %d, %s%s, AdamW, on %s", g.num_layers,
                         g.channels, g.num_heads, g.padded_vocab_size, g.num_parameters(), o.batch, o.seq_len,
                         dtype_name(o.precision), o.tf32 ? " (GEMMs in TF32)" : "", o.device.to_string());
}

namespace {

// One stage's PyTorch run, as benchmarks/torch_stages.py prints it.
struct TorchStage {
  int stage = 0;
  std::string wrapper;
  double step_ms = 0;
  double peak_rss_mib = 0;
  std::string version;
};

// benchmarks/torch_stages.py's arguments for the same model, batch, stages and ranks.
std::string torch_stages_args(const StagesBenchOptions& o, int world_size) {
  const Gpt2Config& g = o.model;
  const int threads = std::max(1, available_cores() / world_size);  // as zero's ranks get (run_rank)
  return absl::StrCat("--layers ", g.num_layers, " --heads ", g.num_heads, " --channels ", g.channels, " --max_seq ",
                      g.max_seq_len, " --vocab ", g.vocab_size, " --batch ", o.batch, " --seq ", o.seq_len, " --ranks ",
                      world_size, " --stages ", absl::StrJoin(o.stages, ","), " --warmup ", o.reps.warmup, " --iters ",
                      o.reps.iters, " --threads ", threads);
}

// Its lines as rows.
std::vector<TorchStage> torch_stage_rows(const std::vector<std::string>& lines) {
  std::vector<TorchStage> rows;
  for (const std::string& line : lines) {
    std::map<std::string, std::string> field;
    for (absl::string_view pair : absl::StrSplit(line, ' '))
      field.insert(absl::StrSplit(pair, absl::MaxSplits('=', 1)));
    TorchStage row{.wrapper = field["wrapper"], .version = field["torch"]};
    if (absl::SimpleAtoi(field["stage"], &row.stage) && absl::SimpleAtod(field["step_ms"], &row.step_ms) &&
        absl::SimpleAtod(field["peak_rss_mib"], &row.peak_rss_mib)) {
      rows.push_back(row);
    }
  }
  return rows;
}

// PyTorch's stages beside zero's step times; zero_speedup = PyTorch's time / zero's.
void print_torch_comparison(const std::vector<StageRow>& zero, const std::vector<TorchStage>& torch, int world_size) {
  ResultTable table({{"stage"}, {"zero_ms", 1}, {"torch"}, {"torch_ms", 1}, {"zero_speedup", 2}, {"torch_rss_MiB", 0}});
  for (const TorchStage& t : torch) {
    const auto z = absl::c_find_if(zero, [&](const StageRow& r) { return r.stage == t.stage; });
    if (z == zero.end()) continue;
    table.add_row({int64_t{t.stage}, z->step_ms, t.wrapper, t.step_ms, t.step_ms / z->step_ms, t.peak_rss_mib});
  }
  std::printf(
      "# PyTorch %s beside zero: the same model, batch and %d ranks; gloo, one process per rank, AdamW "
      "fused; median step (torch_rss: rank 0's process peak, all it holds)\n%s",
      torch.front().version.c_str(), world_size, table.to_text().c_str());
}

// The cores any rank of the job may run on, together (every rank's affinity, or'ed): PyTorch's ranks get them once
// zero's are done. Under mpirun each rank's process is bound to a core of its own, and a child of rank 0's would
// inherit one core for all of PyTorch's ranks.
absl::StatusOr<cpu_set_t> cores_of_every_rank(Communicator& comm) {
  cpu_set_t own;
  if (sched_getaffinity(0, sizeof(own), &own) != 0) {
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  }
  constexpr int64_t kWords = sizeof(cpu_set_t) / sizeof(int32_t);
  std::vector<int32_t> all(kWords * comm.world_size());
  ZERO_RETURN_IF_ERROR(comm.allgather(Tensor(&own, DType::kI32, {kWords}),
                                      Tensor(all.data(), DType::kI32, {static_cast<int64_t>(all.size())}))
                           .wait());
  cpu_set_t every;
  CPU_ZERO(&every);
  for (int r = 0; r < comm.world_size(); ++r) {
    cpu_set_t theirs;
    std::memcpy(&theirs, all.data() + r * kWords, sizeof(theirs));
    CPU_OR(&every, &every, &theirs);
  }
  return every;
}

}  // namespace

absl::Status stages_command() {
  ZERO_ASSIGN_OR_RETURN(const StagesBenchOptions options, stages_options_from_flags());
  std::vector<StageRow> rows;  // rank 0's, in rank 0's process
  int world_size = 0;
  cpu_set_t cores;  // every rank's (with --torch)
  ZERO_RETURN_IF_ERROR(run_on_ranks([&](Communicator& comm) -> absl::Status {
    ZERO_ASSIGN_OR_RETURN(std::vector<StageRow> own, run_stages_bench(comm, options));
    if (options.torch) {
      ZERO_ASSIGN_OR_RETURN(cores, cores_of_every_rank(comm));
    }
    if (comm.rank() != 0) return absl::OkStatus();
    rows = std::move(own);
    world_size = comm.world_size();
    const ResultTable table = stages_bench_table(rows);
    std::printf(
        "# zero-bench stages: %s, backend %s, %d ranks, warmup %d, iters %d\n"
        "# memory: rank 0's peak per category; state = params+grads+master+optim against shard/plan.h; "
        "sent: rank 0's gathers + reductions in the last step against theory (tied wte adds gathers); "
        "wait: rank 0's time per step blocked on communication (not hidden by compute, or a slower "
        "peer); kept: freed host memory the allocator keeps for the next step (runtime/allocator.h)\n",
        describe_model(options).c_str(), std::string(comm.backend_name()).c_str(), comm.world_size(),
        options.reps.warmup, options.reps.iters);
    std::fputs(table.to_text().c_str(), stdout);
    std::fflush(stdout);
    ZERO_RETURN_IF_ERROR(write_csv_flag(table));
    const std::string png = absl::GetFlag(FLAGS_png);
    return png.empty() ? absl::OkStatus() : plot_png(table, png);
  }));
  // PyTorch's run starts once every rank of zero's is done (under mpirun the other ranks' processes have ended by
  // then, rather than spinning in MPI_Finalize), on the cores zero's ranks had together.
  if (!options.torch || rows.empty()) return absl::OkStatus();
  if (sched_setaffinity(0, sizeof(cores), &cores) != 0) {  // this thread's, which the baseline's processes inherit
    return absl::InternalError(absl::StrCat("sched_setaffinity: ", std::strerror(errno)));
  }
  const std::string python = benchmark_python(absl::GetFlag(FLAGS_python));
  const BaselineOutput run = run_baseline(python, ZERO_TORCH_STAGES_SCRIPT, torch_stages_args(options, world_size));
  const std::vector<TorchStage> torch = torch_stage_rows(run.lines);
  if (torch.empty()) {
    std::fputs(missing_torch_note(python, run).c_str(), stdout);
  } else {
    print_torch_comparison(rows, torch, world_size);
  }
  return absl::OkStatus();
}

}  // namespace zero
