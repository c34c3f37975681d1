// zero-bench offload: per stage, the same training steps in RAM, with the optimizer in NVMe files, and at stage 3 with
// the parameter shards too.
#include "examples/bench/offload_bench.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "examples/bench/bench_common.h"
#include "examples/bench/stages_bench.h"
#include "runtime/status.h"
#include "shard/stage.h"

ABSL_FLAG(std::string, nvme_path, std::filesystem::temp_directory_path().string(),
          "offload: directory for the offloaded states' files (a fast local drive)");

namespace zero {
namespace {

// The process's peak resident memory (VmHWM) since the last reset, in bytes; -1 where /proc has none.
// Every local rank is a thread of this process, so it covers them all.
int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kib) == 1) return kib * 1024;
  }
  return -1;
}

// Restarts VmHWM from the current resident memory (Linux: writing 5 to clear_refs).
void reset_peak_resident() { std::ofstream("/proc/self/clear_refs") << "5"; }

// What a run keeps in files: nothing, the optimizer (master weights and state), or also the parameter
// shards (stage 3).
enum class Offloaded { kNone, kOptimizer, kOptimizerAndParams };

absl::string_view offloaded_name(Offloaded o) {
  switch (o) {
    case Offloaded::kNone: return "none";
    case Offloaded::kOptimizer: return "optimizer";
    case Offloaded::kOptimizerAndParams: return "optimizer+params";
  }
  return "";
}

struct OffloadRow {
  StageRow run;
  Offloaded offloaded = Offloaded::kNone;
  int64_t peak_resident = 0;  // the process's, over this run
};

absl::StatusOr<OffloadRow> run_one(Communicator& comm, StagesBenchOptions options, int stage, Offloaded offload) {
  const std::string dir = absl::GetFlag(FLAGS_nvme_path);
  options.offload_optimizer_path = offload != Offloaded::kNone ? dir : "";
  options.offload_param_path = offload == Offloaded::kOptimizerAndParams ? dir : "";
  options.persistence_threshold = 0;  // every unit sharded at stage 3, as the formulas assume
  ZERO_RETURN_IF_ERROR(comm.barrier().wait());
  if (comm.rank() == 0) reset_peak_resident();
  ZERO_RETURN_IF_ERROR(comm.barrier().wait());
  ZERO_ASSIGN_OR_RETURN(StageRow row, run_stage(comm, options, stage));
  ZERO_RETURN_IF_ERROR(comm.barrier().wait());  // every rank's memory is in the peak
  return OffloadRow{.run = row, .offloaded = offload, .peak_resident = peak_resident_bytes()};
}

ResultTable offload_table(const std::vector<OffloadRow>& rows) {
  ResultTable table({{"stage"},
                     {"offloaded"},
                     {"step_ms", 1},
                     {"vs_ram", 3},
                     {"states_ram_MiB", 2},
                     {"formula_MiB", 2},
                     {"in_files_MiB", 2},
                     {"formula_files_MiB", 2},
                     {"rank0_total_MiB", 2},
                     {"process_rss_MiB", 1}});
  double ram_ms = 0;
  for (const OffloadRow& r : rows) {
    if (r.offloaded == Offloaded::kNone) ram_ms = r.run.step_ms;
    table.add_row({int64_t{r.run.stage}, std::string(offloaded_name(r.offloaded)), r.run.step_ms,
                   r.run.step_ms / ram_ms, mib(r.run.model_state_peak()), mib(r.run.formula_model_state),
                   mib(r.run.in_files), mib(r.run.formula_in_files), mib(r.run.memory.peak_total),
                   r.peak_resident < 0 ? 0.0 : mib(r.peak_resident)});
  }
  return table;
}

}  // namespace

absl::Status offload_command() {
  ZERO_ASSIGN_OR_RETURN(const StagesBenchOptions options, stages_options_from_flags());
  return run_on_ranks([&](Communicator& comm) -> absl::Status {
    std::vector<OffloadRow> rows;
    for (int stage : options.stages) {
      for (Offloaded offload : {Offloaded::kNone, Offloaded::kOptimizer, Offloaded::kOptimizerAndParams}) {
        if (offload == Offloaded::kOptimizerAndParams && !StagePolicy(stage).partitions_params()) continue;
        ZERO_ASSIGN_OR_RETURN(OffloadRow row, run_one(comm, options, stage, offload));
        rows.push_back(row);
      }
    }
    if (comm.rank() != 0) return absl::OkStatus();
    std::printf(
        "# zero-bench offload: %s, backend %s, %d ranks, warmup %d, iters %d, nvme_path %s\n"
        "# every unit sharded at stage 3 (persistence threshold 0); states_ram: rank 0's peak "
        "params+grads+master+optim in RAM; in_files: its model states in files; formulas from shard/plan.h; "
        "process_rss: peak resident memory of the whole process (all local ranks), page cache not included\n",
        describe_model(options).c_str(), std::string(comm.backend_name()).c_str(), comm.world_size(),
        options.reps.warmup, options.reps.iters, absl::GetFlag(FLAGS_nvme_path).c_str());
    const ResultTable table = offload_table(rows);
    std::fputs(table.to_text().c_str(), stdout);
    std::fflush(stdout);
    return write_csv_flag(table);
  });
}

}  // namespace zero
