#include "examples/train/report.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/common/median.h"
#include "examples/common/result_table.h"
#include "runtime/status.h"
#include "shard/plan.h"
#include "shard/stage.h"

namespace zero::train {

namespace {

constexpr MemoryCategory kCategories[] = {MemoryCategory::kParams,         MemoryCategory::kGrads,
                                          MemoryCategory::kOptimizerState, MemoryCategory::kMasterWeights,
                                          MemoryCategory::kCommBuffers,    MemoryCategory::kActivations,
                                          MemoryCategory::kWorkspace};

std::string duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// shard/plan.h's input for this run: the formulas for model states and bytes sent per step.
PlanInput plan_of(const RunFacts& f) {
  return {.params = f.params,
          .padded_params = f.padded_params,
          .world_size = f.world_size,
          .stage = f.stage,
          .precision = f.precision,
          .optimizer_state_bytes = 4 * f.optimizer_state_floats,
          .accumulation_steps = f.accumulation_steps,
          .offload_optimizer = f.offload_optimizer,
          .offload_param = f.offload_param,
          .offload_optimizer_to_host = f.offload_optimizer_to_host,
          .offload_param_to_host = f.offload_param_to_host};
}

// Every rank's `mine` on rank 0 (empty elsewhere), gathered as bytes: the ranks run one binary.
template <typename T>
absl::StatusOr<std::vector<T>> gather_on_rank_0(Communicator& comm, T mine) {
  static_assert(std::is_trivially_copyable_v<T>);
  const int n = comm.world_size();
  std::vector<T> all(n);
  const int64_t bytes = sizeof(T);
  ZERO_RETURN_IF_ERROR(
      comm.gather(Tensor(&mine, DType::kU8, {bytes}), Tensor(all.data(), DType::kU8, {n * bytes}), 0).wait());
  if (comm.rank() != 0) all.clear();
  return all;
}

// A rank's phase times, summed over `steps`, in milliseconds per step, in kPhases' order (the table's
// columns and the JSON's keys).
constexpr std::array<const char*, 4> kPhases = {"forward", "backward", "update", "waiting"};
std::array<double, 4> ms_per_step(const PhaseTimes& t, int64_t steps) {
  const auto ms = [&](absl::Duration d) { return absl::ToDoubleMilliseconds(d) / steps; };
  return {ms(t.forward), ms(t.backward), ms(t.update), ms(t.waiting)};
}

// "" without wall_clock_breakdown; else each rank's phases per step.
std::string phase_table(const RunFacts& f) {
  if (f.phases.empty()) return "";
  std::vector<Column> columns = {{"ms_per_step"}};
  for (const char* phase : kPhases) columns.push_back({phase, 1});
  ResultTable table(columns);
  for (size_t r = 0; r < f.phases.size(); ++r) {
    std::vector<Cell> row = {absl::StrCat("rank ", r)};
    for (double ms : ms_per_step(f.phases[r], f.steps)) row.push_back(ms);
    table.add_row(std::move(row));
  }
  return absl::StrCat(
      "\ntime per step by phase (wall_clock_breakdown; waiting: blocked on communication, within "
      "the phases):\n",
      table.to_text());
}

// Rank 0's model states held in files, beside the formula's; "" when nothing is offloaded.
std::string offload_line(const RunFacts& f, const ModelStateBytes& formula, const std::vector<MemoryStats>& peaks) {
  if (!f.offload_optimizer && !f.offload_param) return "";
  const std::string what = f.offload_optimizer && f.offload_param
                               ? "parameter shards, master weights and optimizer state"
                           : f.offload_param ? "parameter shards"
                                             : "master weights and optimizer state";
  const int64_t measured = peaks[0].in_files_total();
  return absl::StrCat(
      "  offloaded to NVMe files: ", what, " ", format_bytes(measured), " on rank 0 (formula ",
      format_bytes(formula.in_files),
      "), in RAM only while a unit uses them (those read ahead too, under offload_optimizer's pipeline_read)",
      f.offload_param && measured < formula.in_files
          ? "; units kept whole (stage3_param_persistence_threshold) stay in RAM"
          : "",
      "\n");
}

std::string ratio(int64_t measured, int64_t theory) {
  return theory == 0 ? std::string("-") : absl::StrFormat("%.3f", static_cast<double>(measured) / theory);
}

// stdout's width in columns, or 80 where it is not a terminal that says.
int terminal_columns() {
  winsize size{};
  return ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0 ? size.ws_col : 80;
}

}  // namespace

double median_after_warmup(std::vector<double> step_seconds) {
  if (step_seconds.size() > 1) step_seconds.erase(step_seconds.begin());
  return median(std::move(step_seconds));
}

std::string progress_bar_line(absl::string_view text, int64_t step, int64_t steps, int columns) {
  // At most columns - 1 characters: writing the last column makes some terminals wrap, and "\r" then
  // rewrites only the new line. The bar takes what the text leaves, up to 30 characters.
  const int room = columns - 1;
  if (static_cast<int>(text.size()) >= room) return std::string(text.substr(0, std::max(room, 0)));
  const int width = std::min(30, room - static_cast<int>(text.size()) - 3);  // "[", "] "
  if (width < 5) return std::string(text);
  const int filled = static_cast<int>(width * step / steps);
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '.'), "] ", text);
}

void Progress::step(int64_t step, const StepResult& r, float lr, double rate, double elapsed_s) {
  const double eta = elapsed_s / (step - first_step_) * (steps_ - step);
  const std::string text =
      absl::StrFormat("step %*d/%d  loss %.4f  lr %.2e  %.0f %s  elapsed %s  eta %s%s",
                      static_cast<int>(absl::StrCat(steps_).size()), step, steps_, r.loss, lr, rate, rate_unit_,
                      duration(elapsed_s), duration(eta), r.skipped ? "  (fp16 overflow: step skipped)" : "");
  if (tty_) {
    // Cleared to the end (\x1b[K) so a shorter line leaves nothing of the last one.
    std::printf("\r%s\x1b[K", progress_bar_line(text, step, steps_, terminal_columns()).c_str());
    open_line_ = true;
  } else if (step == first_step_ + 1 || step == steps_ || step % steps_per_print_ == 0) {
    std::printf("%s\n", text.c_str());
  }
  std::fflush(stdout);
}

void Progress::line(const std::string& text) {
  if (open_line_) std::printf("\n");
  open_line_ = false;
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

absl::StatusOr<MetricsFile> MetricsFile::open(const std::string& path, bool append) {
  if (path.empty()) return MetricsFile();
  std::FILE* file = std::fopen(path.c_str(), append ? "a" : "w");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_path = ", path, ": cannot open it for writing: ", std::strerror(errno)));
  }
  return MetricsFile(file, path);
}

absl::Status MetricsFile::write(const nlohmann::json& record) {
  if (file_ == nullptr) return absl::OkStatus();
  if (std::fprintf(file_.get(), "%s\n", record.dump().c_str()) < 0 || std::fflush(file_.get()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("metrics_path = ", path_, ": cannot write it"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<MemoryStats>> gather_peaks(Communicator& comm, const Allocator& allocator) {
  return gather_on_rank_0(comm, allocator.stats());
}

absl::StatusOr<std::vector<PhaseTimes>> gather_phase_times(Communicator& comm, const PhaseTimes& mine) {
  return gather_on_rank_0(comm, mine);
}

std::string summary_tables(const RunFacts& f, const std::vector<MemoryStats>& peaks) {
  std::vector<Column> columns = {{"peak"}};
  for (MemoryCategory c : kCategories) columns.push_back({std::string(category_name(c))});
  columns.push_back({"total"});
  ResultTable memory(columns);
  for (size_t r = 0; r < peaks.size(); ++r) {
    std::vector<Cell> row = {absl::StrCat("rank ", r)};
    for (MemoryCategory c : kCategories) row.push_back(format_bytes(peaks[r].peak_of(c)));
    row.push_back(format_bytes(peaks[r].peak_total));
    memory.add_row(std::move(row));
  }
  const ModelStateBytes formula = model_state_bytes(plan_of(f));
  memory.add_row({std::string("ZeRO formula"), format_bytes(formula.params), format_bytes(formula.grads),
                  format_bytes(formula.optimizer_state), format_bytes(formula.master_weights), std::string("-"),
                  std::string("-"), std::string("-"), format_bytes(formula.total())});

  const CommBytes theory = comm_bytes_per_step(plan_of(f));
  const auto per_step = [&](int64_t total) { return total / f.steps; };
  ResultTable traffic({{"sent_per_step"}, {"measured"}, {"theory"}, {"ratio"}});
  traffic.add_row({std::string("param_gather"), format_bytes(per_step(f.traffic.param_gather)),
                   format_bytes(theory.param_gather), ratio(per_step(f.traffic.param_gather), theory.param_gather)});
  traffic.add_row({std::string("grad_reduce"), format_bytes(per_step(f.traffic.grad_reduce)),
                   format_bytes(theory.grad_reduce), ratio(per_step(f.traffic.grad_reduce), theory.grad_reduce)});
  traffic.add_row({std::string("small"), format_bytes(per_step(f.traffic.small)), std::string("-"), std::string("-")});

  return absl::StrCat(
      "\npeak memory per rank (allocator) vs the ZeRO formula for stage ", f.stage, ", N = ", f.world_size, ", ",
      dtype_name(f.precision), ", Ψ = ", f.padded_params, " (padded per unit):\n", memory.to_text(),
      offload_line(f, formula, peaks),
      "\nbytes sent by rank 0 per step vs theory (ring collectives: (N-1)/N of each buffer):\n", traffic.to_text(),
      StagePolicy(f.stage).partitions_params()
          ? "  (theory gathers every unit in every forward and backward; stage 3 keeps a unit gathered while the "
            "next max_live_units gathers need it, and gathers a tied owner again for a unit that reads it "
            "otherwise, as GPT-2's head reads the embedding's wte)\n"
          : "",
      absl::StrFormat("\nstep time %.1f ms (median of the %d steps after the first; mean of all %d: %.1f ms), "
                      "%.0f %s/s\n",
                      1e3 * f.median_step_seconds, std::max<int64_t>(f.steps - 1, 1), f.steps,
                      1e3 * f.train_seconds / f.steps, f.predictions_per_s, f.predictions),
      phase_table(f));
}

nlohmann::json summary_json(const RunFacts& f, const std::vector<MemoryStats>& peaks) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const MemoryStats& s : peaks) {
    nlohmann::json rank;
    for (MemoryCategory c : kCategories) rank[std::string(category_name(c))] = s.peak_of(c);
    rank["total"] = s.peak_total;
    rank["in_files"] = s.in_files_total();
    ranks.push_back(rank);
  }
  const ModelStateBytes formula = model_state_bytes(plan_of(f));
  const CommBytes theory = comm_bytes_per_step(plan_of(f));
  nlohmann::json phases = nlohmann::json::array();  // per rank, with wall_clock_breakdown
  for (const PhaseTimes& t : f.phases) {
    const std::array<double, 4> ms = ms_per_step(t, f.steps);
    nlohmann::json rank;
    for (size_t p = 0; p < kPhases.size(); ++p) rank[kPhases[p]] = ms[p];
    phases.push_back(rank);
  }
  return {{"event", "summary"},
          {"run",
           {{"stage", f.stage},
            {"world_size", f.world_size},
            {"accumulation_steps", f.accumulation_steps},
            {"precision", dtype_name(f.precision)},
            {"tf32", f.tf32},
            {"device", f.device.to_string()},
            {"backend", f.backend}}},
          {"peak_bytes", ranks},
          {"formula_bytes",
           {{"params", formula.params},
            {"grads", formula.grads},
            {"optimizer_state", formula.optimizer_state},
            {"master_weights", formula.master_weights},
            {"in_files", formula.in_files}}},
          {"sent_bytes_per_step",
           {{"param_gather", f.traffic.param_gather / f.steps},
            {"grad_reduce", f.traffic.grad_reduce / f.steps},
            {"small", f.traffic.small / f.steps}}},
          {"theory_bytes_per_step", {{"param_gather", theory.param_gather}, {"grad_reduce", theory.grad_reduce}}},
          {"step_ms", 1e3 * f.median_step_seconds},
          {"mean_step_ms", 1e3 * f.train_seconds / f.steps},
          {"phase_ms_per_step", phases},
          {f.predictions + "_per_s", f.predictions_per_s}};
}

}  // namespace zero::train
