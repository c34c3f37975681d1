// zero-train: trains GPT-2 or an MLP under any ZeRO stage from a DeepSpeed-style JSON config, on in-process ranks or
// under mpirun.
//
//   zero-train                                   the embedded default: small GPT-2, addition task, 4 ranks, stage 3
//   zero-train --config my.json --zero_optimization.stage=2 --ranks 2
//   zero-train --model.type=mlp --data.source=blobs --model.widths=[16,64,64,4]
//   mpirun -np 4 zero-train --backend=mpi
//   mpirun -np 8 zero-train --backend=nccl --device=cuda     one process per GPU
//   zero-train --backend=nccl --device=cuda --ranks 8          one process driving 8 GPUs
//   zero-train --device=cuda --ranks 2                        two ranks sharing cuda:0
//   zero-train --device=sim                                   the GPU path on the simulated device, checked
//
// Every key of the config (train_config.h) can be overridden as --key.path=value or --key.path value.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "examples/common/gnuplot.h"
#include "examples/train/checkpoints.h"
#include "examples/train/deepspeed_optim.h"
#include "examples/train/evaluate.h"
#include "examples/train/loss_plot.h"
#include "examples/train/report.h"
#include "examples/train/train_config.h"
#include "models/data/addition.h"
#include "models/data/blobs.h"
#include "models/data/data_loader.h"
#include "models/data/device_batch.h"
#include "models/data/token_shard.h"
#include "models/gpt2.h"
#include "models/gpt2_weights.h"
#include "models/mlp.h"
#include "runtime/comm/local.h"
#include "runtime/device.h"
#include "runtime/file_memory.h"
#include "runtime/status.h"
#include "shard/engine.h"
#ifdef ZERO_HAS_MPI
// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "runtime/comm/mpi.h"
#endif
#ifdef ZERO_HAS_NCCL
#include "runtime/comm/nccl.h"
#endif

namespace zero::train {
namespace {

constexpr char kUsage[] =
    "usage: zero-train [--config FILE.json] [--key.path=value | --key.path value ...]\n"
    "       mpirun -np N zero-train --backend=mpi [...]\n"
    "       mpirun -np N zero-train --backend=nccl --device=cuda [...]   (one process per GPU)\n"
    "       zero-train --backend=nccl --device=cuda --ranks N [...]      (one process driving N GPUs)\n"
    "       zero-train --device=sim [...]   (the GPU path on the simulated device: CUDA's ordering rules, checked)\n"
    "Trains GPT-2 (or an MLP: --model.type=mlp --data.source=blobs) under ZeRO stage 0-3. Without --config it runs the "
    "embedded default (a small GPT-2 learning\n"
    "3-digit addition on 4 in-process ranks at stage 3). Keys follow DeepSpeed's where the concept is the same;\n"
    "--key.path=null removes a key (its default applies), and \"auto\" values are filled as Hugging Face's Trainer "
    "fills them;\n"
    "every key, its default and its meaning: README.md, section \"Config reference (zero-train)\".\n"
    "       zero-train --plot_metrics=FILE.jsonl   draws a metrics file's loss curve into FILE.png\n";

// Everything a rank needs, settled before any parameter is allocated.
struct Plan {
  TrainConfig config;
  BatchPlan batch;
  ZeroConfig zero;
  Gpt2Config gpt2;  // gpt2 only; the MLP's shape is config.model.widths
  std::shared_ptr<const data::Dataset> train;
  std::shared_ptr<const data::Dataset> val;
  std::shared_ptr<const data::AdditionDataset> task;  // null for token shards
  int64_t num_params = 0;
};

absl::Status load_blobs(const BlobsKeys& b, Plan& plan) {
  data::BlobsConfig blobs{
      .features = b.features, .classes = b.classes, .noise = b.noise, .rows = b.train_rows, .seed = b.seed};
  ZERO_ASSIGN_OR_RETURN(data::BlobsDataset train, data::BlobsDataset::create(blobs));
  blobs.rows = b.val_rows;
  blobs.split = data::BlobsSplit::kVal;
  ZERO_ASSIGN_OR_RETURN(data::BlobsDataset val, data::BlobsDataset::create(blobs));
  plan.train = std::make_shared<data::BlobsDataset>(std::move(train));
  plan.val = std::make_shared<data::BlobsDataset>(std::move(val));
  return absl::OkStatus();
}

absl::Status load_data(const DataConfig& d, Plan& plan) {
  if (d.source == "blobs") return load_blobs(d.blobs, plan);
  if (d.source == "tokens") {
    ZERO_ASSIGN_OR_RETURN(data::TokenShardDataset train,
                          data::TokenShardDataset::open(d.train_glob, d.seq_len, d.vocab_size));
    ZERO_ASSIGN_OR_RETURN(data::TokenShardDataset val,
                          data::TokenShardDataset::open(d.val_glob, d.seq_len, d.vocab_size));
    plan.train = std::make_shared<data::TokenShardDataset>(std::move(train));
    plan.val = std::make_shared<data::TokenShardDataset>(std::move(val));
    return absl::OkStatus();
  }
  data::AdditionConfig task{
      .digits = d.digits, .examples_per_row = d.examples_per_row, .rows = d.train_rows, .seed = d.seed};
  ZERO_ASSIGN_OR_RETURN(data::AdditionDataset train, data::AdditionDataset::create(task));
  task.rows = d.val_rows;
  task.split = data::AdditionSplit::kVal;
  ZERO_ASSIGN_OR_RETURN(data::AdditionDataset val, data::AdditionDataset::create(task));
  plan.train = std::make_shared<data::AdditionDataset>(std::move(train));
  auto val_task = std::make_shared<data::AdditionDataset>(std::move(val));
  plan.val = val_task;
  plan.task = val_task;
  return absl::OkStatus();
}

absl::StatusOr<Gpt2Config> model_shape(const TrainConfig& c, int64_t seq_len) {
  const int64_t vocab = c.data.source == "addition" ? data::kAdditionVocabSize : c.data.vocab_size;
  const ModelConfig& m = c.model;
  if (m.preset == "custom") return Gpt2Config::make(seq_len, vocab, m.num_layers, m.num_heads, m.channels);
  ZERO_ASSIGN_OR_RETURN(Gpt2Config preset, Gpt2Config::preset(m.preset));
  if (preset.max_seq_len < seq_len || preset.vocab_size < vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.preset = ", m.preset, ": it takes ", preset.max_seq_len, " positions and ", preset.vocab_size,
        " tokens, the data has sequences of ", seq_len, " over ", vocab, " tokens; pick a larger preset or custom"));
  }
  return preset;
}

// A fresh model of the plan's shape: it declares its parameters' shapes and allocates nothing.
absl::StatusOr<std::unique_ptr<Model>> create_model(const Plan& plan) {
  if (plan.config.model.type == "mlp") return Mlp::create(plan.config.model.widths);
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Gpt2> gpt2, Gpt2::create(plan.gpt2));
  for (int64_t layer = 0; layer < plan.gpt2.num_layers; ++layer)
    gpt2->set_recompute(layer, plan.config.model.recompute);
  return gpt2;
}

// The ranks this machine runs: every local rank, or the launcher's count of processes on this node.
int ranks_on_this_machine(const TrainConfig& config, int world_size) {
  if (config.backend == "local") return world_size;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"}) {
    int ranks = 0;
    if (const char* value = std::getenv(name); value != nullptr && absl::SimpleAtoi(value, &ranks) && ranks > 0) {
      return ranks;
    }
  }
  return 1;
}

int64_t physical_memory_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGE_SIZE));
}

// An export that cannot be written is refused before any training: its directory must exist.
absl::Status check_export_path(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  const std::filesystem::path dir = std::filesystem::path(gpt2_hf_export_file(path)).parent_path();
  std::error_code ec;
  if (dir.empty() || std::filesystem::is_directory(dir, ec)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("export_path = ", path, ": ", dir.string(),
                   std::filesystem::exists(dir, ec) ? " is not a directory" : " does not exist"));
}

absl::StatusOr<Plan> make_plan(const TrainConfig& config, int world_size, Device device) {
  ZERO_RETURN_IF_ERROR(check_export_path(config.export_path));
  if (!config.plot_path.empty()) {
    if (const absl::Status gnuplot = check_gnuplot(); !gnuplot.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("plot_path = ", config.plot_path, ": ", gnuplot.message()));
    }
  }
  Plan plan{.config = config};
  ZERO_ASSIGN_OR_RETURN(plan.batch, resolve_batch(config, world_size));
  ZERO_RETURN_IF_ERROR(load_data(config.data, plan));
  if (config.model.type == "gpt2") {
    ZERO_ASSIGN_OR_RETURN(plan.gpt2, model_shape(config, plan.train->layout().input_shape[0]));  // T
    ZERO_RETURN_IF_ERROR(check_machine_holds(config, plan.gpt2, world_size, ranks_on_this_machine(config, world_size),
                                             physical_memory_bytes()));
  }
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, create_model(plan));
  std::vector<UnitSize> units;
  for (Unit* u : model->units()) {
    UnitSize size{.name = std::string(u->name())};
    for (const ParamSpec& p : u->param_specs()) size.numel += shape_numel(p.shape);
    units.push_back(size);
    plan.num_params += size.numel;
  }
  ZERO_ASSIGN_OR_RETURN(plan.zero, engine_config(config, plan.batch, world_size, units, device));
  return plan;
}

std::string describe_model(const Plan& p) {
  if (p.config.model.type == "mlp")
    return absl::StrCat("MLP widths [", absl::StrJoin(p.config.model.widths, ", "), "]");
  const Gpt2Config& g = p.gpt2;
  return absl::StrFormat("GPT-2 L=%d NH=%d C=%d T=%d V=%d%s", g.num_layers, g.num_heads, g.channels,
                         p.train->layout().input_shape[0], g.vocab_size,
                         p.config.model.recompute ? ", blocks recomputed in backward" : "");
}

// "" or a line naming what goes to host memory or to files where, warning when a directory is in RAM itself (tmpfs).
std::string describe_offload(const ZeroConfig& z) {
  std::string out =
      z.offload_optimizer_to_host
          ? absl::StrCat("\n  offload: optimizer (fp32 master weights and state)",
                         z.offload_param_to_host ? " and parameter shards" : "", " to host memory, stepped on the CPU",
                         z.delayed_update_after >= 0
                             ? absl::StrCat(", delayed one step after step ", z.delayed_update_after)
                             : "")
          : "";
  for (const auto& [what, dir] :
       {std::pair{"optimizer", &z.offload_optimizer_path}, std::pair{"parameter shards", &z.offload_param_path}}) {
    if (dir->empty()) continue;
    absl::StrAppend(&out, out.empty() ? "\n  offload: " : ", ", what, " to ", *dir,
                    files_stay_in_ram(*dir) ? " (warning: a file system in RAM, so this frees no memory)" : "");
  }
  return out;
}

std::string describe(const Plan& p, int world_size) {
  return absl::StrFormat(
      "zero-train: %s (%d params) on %s, %d %s ranks%s, ZeRO stage %d, %s\n"
      "  batch %d = micro %d x accumulation %d x ranks %d %s, %s %s, %d steps%s",
      describe_model(p), p.num_params, p.config.data.source, world_size, p.config.backend,
      p.zero.device.is_cpu() ? "" : absl::StrCat(" on ", p.zero.device.to_string()), p.zero.stage,
      absl::StrCat(dtype_name(p.zero.precision), p.zero.tf32 ? " (GEMMs in TF32)" : ""), p.batch.train_batch_size,
      p.batch.micro_batch, p.batch.accumulation_steps, world_size,
      p.config.model.type == "mlp" ? "points" : "sequences", p.config.optimizer.type,
      p.config.scheduler.type.empty() ? "constant lr" : p.config.scheduler.type, p.config.steps,
      describe_offload(p.zero));
}

// Fills the engine from init_from; returns a line saying what the load did beyond copying, "" if nothing.
absl::StatusOr<std::string> load_initial_weights(const Plan& plan, Engine& engine) {
  if (plan.config.init_from.empty()) return "";
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(plan.config.init_from, plan.gpt2);
  if (!reader.ok()) {
    return absl::Status(reader.status().code(),
                        absl::StrCat("init_from = ", plan.config.init_from, ": ", reader.status().message()));
  }
  ZERO_RETURN_IF_ERROR(engine.load_params(
      [&](absl::string_view unit, absl::string_view param, Tensor dst) { return reader->fill(unit, param, dst); }));
  if (reader->notes().empty()) return "";
  return absl::StrCat("  init_from ", plan.config.init_from, ": ", absl::StrJoin(reader->notes(), "; "));
}

// Rank 0 writes the full weights and their config.json to export_path; returns its line for the log ("" on
// other ranks and without an export).
absl::StatusOr<std::string> export_weights(const Plan& plan, Engine& engine, int rank) {
  if (plan.config.export_path.empty()) return "";
  Gpt2HfWriter writer(plan.gpt2);
  ZERO_RETURN_IF_ERROR(engine.visit_full_params([&](absl::string_view unit, absl::string_view param, const Tensor& v) {
    return rank == 0 ? writer.add(unit, param, v) : absl::OkStatus();
  }));
  if (rank != 0) return "";
  return writer.export_to(plan.config.export_path);
}

// Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMI and PMIx launchers (MPICH's, srun's) PMI_SIZE or PMIX_RANK.
bool started_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

// The number of processes a launcher started this one among, and the variable that says so: mpirun's
// (OMPI_COMM_WORLD_SIZE, PMI_SIZE), Slurm's srun (SLURM_STEP_NUM_TASKS: the step's tasks, so a batch script's
// one process is not counted as the allocation's N) or a torchrun-style launcher's (WORLD_SIZE). {1, ""} when
// none did.
std::pair<int64_t, std::string> launched_among() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "WORLD_SIZE"}) {
    int64_t size = 0;
    if (const char* value = std::getenv(name); value != nullptr && absl::SimpleAtoi(value, &size) && size > 1) {
      return {size, name};
    }
  }
  return {1, ""};
}

// backend = local, and nccl without mpirun, start every rank inside this process: started as one of several
// processes, each would train a copy of its own. Refused, with the command that trains one model.
absl::Status check_not_one_of_several_processes(const TrainConfig& config) {
  const auto [processes, variable] = launched_among();
  if (processes == 1) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "backend = ", config.backend, " starts all ", config.ranks, " rank(s) inside this process, but ", variable, "=",
      processes, " says it is one of ", processes, " processes, each of which would train a copy of its own; ",
      "under mpirun add --backend=mpi (or --backend=nccl --device=cuda), as mpirun -np ", processes,
      " zero-train --backend=mpi; torchrun-style launchers are not supported: start one process with --ranks ",
      processes, ", or mpirun"));
}

// A rank's allocator, with memory_budget_mib as its budget.
// The device config.device names: the one local ranks share (under nccl, rank r takes cuda:r instead).
Device configured_device(const TrainConfig& config) {
  return config.device == "cuda" ? Device::cuda(0) : config.device == "sim" ? Device::sim(0) : Device::cpu();
}

// memory_budget_mib bounds the memory of the rank's device: RAM on the CPU, the GPU's on a GPU.
Allocator rank_allocator(const TrainConfig& config, int rank) {
  return Allocator(rank,
                   config.memory_budget_mib > 0 ? std::optional<int64_t>(config.memory_budget_mib << 20) : std::nullopt,
                   configured_device(config).type);
}

// One rank's run: engine, data, the loop with periodic evaluation, the summary.
class RankRun {
 public:
  // `allocator` is this rank's, with the budget (rank_allocator); the communicator may account its scratch there too.
  RankRun(Communicator& comm, const Plan& plan, Allocator& allocator)
      : comm_(comm), plan_(plan), allocator_(allocator),
        schedule_(plan.config.scheduler, plan.config.optimizer.lr, plan.config.steps), lead_(comm.rank() == 0) {}

  // Running out of the budget, whether the engine's states or a step's activations, is the budget's fault.
  absl::Status run() {
    const absl::Status status = setup_and_train();
    if (!is_out_of_memory(status)) return status;
    return absl::InvalidArgumentError(
        absl::StrCat("memory_budget_mib = ", plan_.config.memory_budget_mib, " is too small: ", status.message()));
  }

 private:
  absl::Status setup_and_train() {
    ZERO_RETURN_IF_ERROR(setup());
    const int64_t steps = plan_.config.steps;
    for (int64_t step = first_step_ + 1; step <= steps; ++step) {
      ZERO_RETURN_IF_ERROR(train_step(step));
      // A delayed update of the last step is applied before its evaluation and export see the parameters.
      if (step == steps) ZERO_RETURN_IF_ERROR(engine_->apply_delayed_update());
      const bool eval_due = plan_.config.eval_interval > 0 && step % plan_.config.eval_interval == 0;
      if (eval_due || step == steps) ZERO_RETURN_IF_ERROR(evaluate(step));
      if (checkpoint_due(plan_.config.checkpoint, step, steps)) {
        ZERO_RETURN_IF_ERROR(save_run(plan_.config.checkpoint, *engine_, comm_, *loader_, step));
      }
    }
    ZERO_ASSIGN_OR_RETURN(const std::string exported, export_weights(plan_, *engine_, comm_.rank()));
    if (!exported.empty()) progress_->line(exported);
    if (first_step_ < steps) ZERO_RETURN_IF_ERROR(summarize());
    return plot_loss();
  }

  // Rank 0 draws the metrics file it wrote, once its last line is in.
  absl::Status plot_loss() {
    if (!lead_ || plan_.config.plot_path.empty()) return absl::OkStatus();
    ZERO_ASSIGN_OR_RETURN(const std::string line, plot_loss_curve(plan_.config.metrics_path, plan_.config.plot_path));
    progress_->line(line);
    return absl::OkStatus();
  }

  absl::Status setup() {
    ZERO_ASSIGN_OR_RETURN(model_, create_model(plan_));
    ZERO_ASSIGN_OR_RETURN(
        engine_, Engine::create(*model_, comm_, allocator_, optimizer_factory(plan_.config.optimizer), plan_.zero));
    ZERO_ASSIGN_OR_RETURN(const std::string loaded, load_initial_weights(plan_, *engine_));
    const data::SamplerOptions sampler{
        .world_size = comm_.world_size(), .rank = comm_.rank(), .seed = plan_.config.seed};
    absl::StatusOr<data::DataLoader> loader =
        data::DataLoader::create(plan_.train, plan_.batch.micro_batch, sampler, allocator_);
    if (!loader.ok()) return absl::InvalidArgumentError(absl::StrCat("the training data: ", loader.status().message()));
    loader_ = std::make_unique<data::DataLoader>(std::move(*loader));
    ZERO_ASSIGN_OR_RETURN(first_step_, resume_run(plan_.config.checkpoint, *engine_, comm_, *loader_));
    ZERO_ASSIGN_OR_RETURN(evaluator_, Evaluator::create(plan_.val, plan_.task, plan_.batch.micro_batch, comm_,
                                                        allocator_, plan_.zero.device));
    ZERO_ASSIGN_OR_RETURN(metrics_, MetricsFile::open(lead_ ? plan_.config.metrics_path : "", first_step_ > 0));
    const bool mlp = plan_.config.model.type == "mlp";
    // Open MPI gives its ranks a pseudo-terminal: a progress bar redrawn by several processes is garbled.
    const bool terminal = isatty(fileno(stdout)) == 1 && !started_by_mpirun() && plan_.config.backend != "mpi";
    progress_.emplace(first_step_, plan_.config.steps, plan_.config.steps_per_print, terminal,
                      mlp ? "samples/s" : "tok/s");
    if (!lead_) return absl::OkStatus();
    progress_->line(describe(plan_, comm_.world_size()));
    if (!loaded.empty()) progress_->line(loaded);
    if (first_step_ > 0) {
      progress_->line(absl::StrFormat("resumed after step %d from a checkpoint (checkpoint.resume = %s)%s", first_step_,
                                      plan_.config.checkpoint.resume,
                                      first_step_ >= plan_.config.steps ? "; nothing is left to train" : ""));
    }
    return absl::OkStatus();
  }

  absl::Status train_step(int64_t step) {
    const float lr = schedule_.lr(step);
    const auto start = std::chrono::steady_clock::now();
    engine_->reset_comm_volume();
    for (int64_t m = 0; m < plan_.batch.accumulation_steps; ++m) {
      ZERO_ASSIGN_OR_RETURN(const Batch batch, device_batch_.place(loader_->next()));
      ZERO_RETURN_IF_ERROR(engine_->forward_backward(batch));
    }
    ZERO_ASSIGN_OR_RETURN(StepResult result, engine_->step(lr));
    step_seconds_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    train_seconds_ += step_seconds_.back();
    const CommVolume v = engine_->comm_volume();
    traffic_.param_gather += v.param_gather;
    traffic_.grad_reduce += v.grad_reduce;
    traffic_.small += v.small;
    if (!lead_) return absl::OkStatus();
    const double rate = static_cast<double>((step - first_step_) * predictions_per_step()) / train_seconds_;
    progress_->step(step, result, lr, rate, train_seconds_);
    return metrics_.write(
        {{"event", "train"},
         {"step", step},
         {"loss", result.loss},
         {"lr", lr},
         {"accuracy", result.predictions > 0 ? static_cast<double>(result.correct) / result.predictions : 0.0},
         {"grad_norm", result.grad_norm},
         {"skipped", result.skipped},
         {prediction_name() + "_per_s", rate},
         {"elapsed_s", train_seconds_}});
  }

  absl::Status evaluate(int64_t step) {
    ZERO_ASSIGN_OR_RETURN(EvalResult r, evaluator_->evaluate(*engine_, comm_, plan_.config.eval_batches));
    if (!lead_) return absl::OkStatus();
    const double accuracy = r.predictions > 0 ? static_cast<double>(r.correct) / r.predictions : 0.0;
    const double answers = r.answers > 0 ? static_cast<double>(r.answers_correct) / r.answers : 0.0;
    progress_->line(eval_line(step, r, accuracy, answers));
    return metrics_.write({{"event", "eval"},
                           {"step", step},
                           {"val_loss", r.loss},
                           {"val_accuracy", accuracy},
                           {"val_answer_accuracy", answers}});
  }

  std::string eval_line(int64_t step, const EvalResult& r, double accuracy, double answers) const {
    if (plan_.task != nullptr) {
      return absl::StrFormat("eval step %d: val loss %.4f  answer digits %.1f%%  whole answers %.1f%% (of %d)", step,
                             r.loss, 100 * accuracy, 100 * answers, r.answers);
    }
    return absl::StrFormat("eval step %d: val loss %.4f  %s accuracy %.1f%% (of %d)", step, r.loss,
                           plan_.config.model.type == "mlp" ? "class" : "next-token", 100 * accuracy, r.predictions);
  }

  absl::Status summarize() {
    ZERO_ASSIGN_OR_RETURN(std::vector<MemoryStats> peaks, gather_peaks(comm_, allocator_));
    std::vector<PhaseTimes> phases;
    if (plan_.zero.time_phases) {
      ZERO_ASSIGN_OR_RETURN(phases, gather_phase_times(comm_, engine_->phase_times()));
    }
    if (!lead_) return absl::OkStatus();
    const int64_t steps_run = plan_.config.steps - first_step_;
    const double median_step_seconds = median_after_warmup(step_seconds_);
    const RunFacts facts{.stage = plan_.zero.stage,
                         .world_size = comm_.world_size(),
                         .accumulation_steps = plan_.zero.accumulation_steps,
                         .precision = plan_.zero.precision,
                         .tf32 = plan_.zero.tf32,
                         .device = plan_.zero.device,
                         .backend = std::string(comm_.backend_name()),
                         .optimizer_state_floats = optimizer_state_floats(plan_.config.optimizer),
                         .offload_optimizer = !plan_.zero.offload_optimizer_path.empty(),
                         .offload_param = !plan_.zero.offload_param_path.empty(),
                         .offload_optimizer_to_host = plan_.zero.offload_optimizer_to_host,
                         .offload_param_to_host = plan_.zero.offload_param_to_host,
                         .params = engine_->num_params(),
                         .padded_params = engine_->num_padded_params(),
                         .steps = steps_run,
                         .traffic = traffic_,
                         .train_seconds = train_seconds_,
                         .median_step_seconds = median_step_seconds,
                         .phases = std::move(phases),
                         .predictions_per_s = static_cast<double>(predictions_per_step()) / median_step_seconds,
                         .predictions = prediction_name()};
    progress_->line(summary_tables(facts, peaks));
    return metrics_.write(summary_json(facts, peaks));
  }

  // Predictions per step: tokens for GPT-2 (T per sequence), samples for the MLP (one label each).
  int64_t predictions_per_step() const {
    return plan_.batch.train_batch_size * shape_numel(plan_.train->layout().target_shape);
  }
  std::string prediction_name() const { return plan_.config.model.type == "mlp" ? "samples" : "tokens"; }

  Communicator& comm_;
  const Plan& plan_;
  Allocator& allocator_;
  LrSchedule schedule_;
  std::optional<Progress> progress_;  // set up once the first step is known
  const bool lead_;                   // rank 0 prints and writes
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<Evaluator> evaluator_;
  MetricsFile metrics_;
  data::DeviceBatch device_batch_{allocator_, plan_.zero.device};  // the loader's batches on the engine's device
  CommVolume traffic_;
  int64_t first_step_ = 0;  // steps done before this process started (from a checkpoint)
  double train_seconds_ = 0;
  std::vector<double> step_seconds_;  // each step's, in order
};

struct Command {
  std::string config_path;
  std::vector<std::string> overrides;  // "key.path=value"
  bool help = false;
  bool version = false;
  std::string plot_metrics;  // --plot_metrics=FILE: draw FILE's loss curve into FILE.png, train nothing
};

absl::StatusOr<Command> parse_command_line(int argc, char** argv) {
  Command command;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "--version") {
      (arg == "--version" ? command.version : command.help) = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'; keys are given as --key=value"));
    }
    std::string key_value = arg.substr(2);
    if (key_value.find('=') == std::string::npos) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      key_value = absl::StrCat(key_value, "=", argv[++i]);
    }
    if (absl::StartsWith(key_value, "plot_metrics=")) {
      command.plot_metrics = key_value.substr(std::strlen("plot_metrics="));
      if (command.plot_metrics.empty()) return absl::InvalidArgumentError("--plot_metrics needs a metrics file");
      continue;
    }
    if (absl::StartsWith(key_value, "config=")) {
      command.config_path = key_value.substr(7);
    } else {
      command.overrides.push_back(key_value);
    }
  }
  return command;
}

// A config file's text. A config is a small regular file: /dev/zero or a fifo would be read until memory runs out.
absl::StatusOr<std::string> read_config_file(const std::string& path) {
  constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;
  std::error_code ec;
  const std::filesystem::file_status type = std::filesystem::status(path, ec);
  if (!ec && type.type() != std::filesystem::file_type::regular) {
    return absl::InvalidArgumentError(absl::StrCat("--config ", path, ": not a regular file"));
  }
  const uintmax_t bytes = ec ? 0 : std::filesystem::file_size(path, ec);
  if (!ec && bytes > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config ", path, ": ", bytes, " bytes; a config is at most ", kMaxConfigBytes, " bytes"));
  }
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("--config ", path, ": cannot read it"));
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

absl::StatusOr<TrainConfig> load_config(const Command& command) {
  if (command.config_path.empty()) return parse_default_config(command.overrides);
  ZERO_ASSIGN_OR_RETURN(const std::string text, read_config_file(command.config_path));
  absl::StatusOr<TrainConfig> config = parse_train_config(text, command.overrides);
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(command.config_path, ": ", config.status().message()));
  }
  return config;
}

// Every error zero-train prints: "zero-train: <message>", with no status code, and the exit status for it:
// 2 for what the user can fix in the config, flags or files, 1 for a run that failed.
int report_failure(const absl::Status& status) {
  std::fprintf(stderr, "zero-train: %s\n", std::string(status.message()).c_str());
  std::fflush(stderr);
  const bool bad_input =
      absl::IsInvalidArgument(status) || absl::IsNotFound(status) || absl::IsFailedPrecondition(status);
  return bad_input ? 2 : 1;
}

#ifdef ZERO_HAS_MPI
// One rank of an mpirun-launched job: its plan needs the world size, and under nccl its GPU.
absl::Status train_launched_rank(const TrainConfig& config, Communicator& comm, Allocator& allocator) {
  // mpirun starts these ranks. A launcher that starts the processes itself (torchrun sets WORLD_SIZE)
  // leaves each in an MPI world of one, where it would train alone.
  int64_t launched = 1;
  if (const char* world = std::getenv("WORLD_SIZE");
      world != nullptr && absl::SimpleAtoi(world, &launched) && launched > comm.world_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend = ", config.backend, ": WORLD_SIZE is ", launched, " but MPI sees ", comm.world_size(),
        " rank(s); start the ranks with mpirun -np ", launched, " (torchrun-style launchers are not MPI)"));
  }
  ZERO_ASSIGN_OR_RETURN(const Plan plan, make_plan(config, comm.world_size(), comm.home_device()));
  return RankRun(comm, plan, allocator).run();
}

// A failed rank cannot return to main while its peers wait in collectives: it reports as main does and ends
// the job with the same exit status (run_mpi_launched would print the status code and end it with 1).
absl::Status run_launched_rank(const TrainConfig& config, Communicator& comm, Allocator& allocator) {
  const absl::Status status = train_launched_rank(config, comm, allocator);
  if (!status.ok()) MPI_Abort(MPI_COMM_WORLD, report_failure(status));
  return status;
}

// The rank mpirun gave this process, before MPI is initialized: only for the allocator's messages.
int launched_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    int rank = 0;
    if (const char* value = std::getenv(name); value != nullptr && absl::SimpleAtoi(value, &rank)) return rank;
  }
  return 0;
}
#endif

// A rank of this process: its own allocator, then its run.
absl::Status train_one_rank(Communicator& comm, const Plan& plan) {
  Allocator allocator = rank_allocator(plan.config, comm.rank());
  return RankRun(comm, plan, allocator).run();
}

// device = cuda with local ranks: refused before they start, naming what is missing (exit 2, as for the other
// faults of where zero-train runs), not by the first CUDA call's bare error.
absl::Status check_gpu() {
  const absl::Status status = check_cuda_device(0);
  if (status.ok()) return status;
  return absl::FailedPreconditionError(absl::StrCat("device = cuda: ", status.message(), ", or use device = cpu"));
}

// backend = nccl without mpirun: this process drives config.ranks GPUs, rank r on cuda:r.
absl::Status run_nccl_ranks_on_this_process(const TrainConfig& config) {
#ifdef ZERO_HAS_NCCL
  // The plan is made first, so a bad config is refused before any GPU is touched; ranks differ in their GPU.
  ZERO_ASSIGN_OR_RETURN(const Plan shared, make_plan(config, config.ranks, Device::cuda(0)));
  return root_cause(run_nccl_ranks_in_process(config.ranks, [&](Communicator& comm) -> absl::Status {
    Plan plan = shared;
    plan.zero.device = comm.home_device();
    return train_one_rank(comm, plan);
  }));
#else
  (void)config;
  return absl::InvalidArgumentError("backend = nccl: this zero-train was built without NCCL; use local");
#endif
}

absl::Status run_ranks(const TrainConfig& config) {
  ZERO_RETURN_IF_ERROR(CommOptions::parse_env().status());  // a deadline the user set, or a clear refusal
  // Under mpirun a failing rank prints its error and aborts the whole job (run_launched_rank).
  if (config.backend == "mpi") {
#ifdef ZERO_HAS_MPI
    // The allocator outlives the communicator, which accounts its scratch there (CommOptions::allocator).
    Allocator allocator = rank_allocator(config, launched_rank());
    CommOptions options = CommOptions::from_env();
    options.allocator = &allocator;
    const int exit_code =
        run_mpi_rank([&](Communicator& comm) { return run_launched_rank(config, comm, allocator); }, options);
    return exit_code == 0 ? absl::OkStatus() : absl::InternalError("an mpi rank failed");
#else
    return absl::InvalidArgumentError("backend = mpi: this zero-train was built without MPI; use local");
#endif
  }
  const bool ranks_in_this_process = config.backend == "local" || !started_by_mpirun();
  if (ranks_in_this_process) ZERO_RETURN_IF_ERROR(check_not_one_of_several_processes(config));
  if (config.backend == "nccl" && !started_by_mpirun()) return run_nccl_ranks_on_this_process(config);
  if (config.backend == "nccl") {
#if defined(ZERO_HAS_NCCL) && defined(ZERO_HAS_MPI)
    const int exit_code = run_mpi_launched([] { return make_nccl_communicator_from_mpi(); },
                                           [&](Communicator& comm) {
                                             Allocator allocator = rank_allocator(config, comm.rank());
                                             return run_launched_rank(config, comm, allocator);
                                           });
    return exit_code == 0 ? absl::OkStatus() : absl::InternalError("an nccl rank failed");
#else
    return absl::InvalidArgumentError(
        "backend = nccl: this zero-train was built without NCCL and MPI (mpirun starts the ranks); use local");
#endif
  }
  // Local ranks share one device; the plan is made before they start, so a bad config is refused first.
  const Device device = configured_device(config);
  ZERO_ASSIGN_OR_RETURN(const Plan plan, make_plan(config, config.ranks, device));
  if (device.is_cuda()) ZERO_RETURN_IF_ERROR(check_gpu());
  return root_cause(run_local_ranks(config.ranks, [&](Communicator& comm) { return train_one_rank(comm, plan); }));
}

}  // namespace
}  // namespace zero::train

int main(int argc, char** argv) {
  using namespace zero::train;
  absl::StatusOr<Command> command = parse_command_line(argc, argv);
  if (command.ok() && command->version) {
    std::printf("zero-train %s\n", ZERO_VERSION);
    return 0;
  }
  if (command.ok() && !command->plot_metrics.empty()) {
    const std::string png = std::filesystem::path(command->plot_metrics).replace_extension(".png").string();
    const absl::StatusOr<std::string> plotted = plot_loss_curve(command->plot_metrics, png);
    if (!plotted.ok()) return report_failure(plotted.status());
    std::printf("%s\n", plotted->c_str());
    return 0;
  }
  if (command.ok() && command->help) {
    std::printf(
        "%s\nThe embedded default, which --config replaces whole (a run shorter than 200 steps warms up for a "
        "tenth of itself):\n%s",
        kUsage, default_config_json());
    return 0;
  }
  absl::StatusOr<TrainConfig> config = command.ok() ? load_config(*command) : command.status();
  if (!config.ok()) {
    report_failure(config.status());
    std::fputs(kUsage, stderr);
    return 2;  // whatever the code: the command line or the config is at fault
  }
  const absl::Status status = run_ranks(*config);
  return status.ok() ? 0 : report_failure(status);
}
