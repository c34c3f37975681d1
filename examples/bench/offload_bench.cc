// zero-bench offload: per stage, the same training steps in RAM, with the optimizer in NVMe files or (an engine on a
// device) in host memory, and at stage 3 with the parameter shards too.
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

// Where a run keeps what it offloads: nowhere, NVMe files (ZeRO-Infinity), or host memory beside a device engine
// (ZeRO-Offload); the optimizer (master weights and state), or at stage 3 the parameter shards too.
struct Offload {
  enum class To { kNone, kFiles, kHost };
  To to = To::kNone;
  bool params = false;

  std::string name() const {
    if (to == To::kNone) return "none";
    return absl::StrCat(to == To::kFiles ? "files:" : "host:", params ? "optimizer+params" : "optimizer");
  }
};

struct OffloadRow {
  StageRow run;
  Offload offload;
  int64_t peak_resident = 0;  // the process's, over this run
};

absl::StatusOr<OffloadRow> run_one(Communicator& comm, StagesBenchOptions options, int stage, Offload offload) {
  const std::string dir = absl::GetFlag(FLAGS_nvme_path);
  const bool files = offload.to == Offload::To::kFiles, host = offload.to == Offload::To::kHost;
  options.offload_optimizer_path = files ? dir : "";
  options.offload_param_path = files && offload.params ? dir : "";
  options.offload_optimizer_to_host = host;
  options.offload_param_to_host = host && offload.params;
  options.persistence_threshold = 0;  // every unit sharded at stage 3, as the formulas assume
  ZERO_RETURN_IF_ERROR(comm.barrier().wait());
  if (comm.rank() == 0) reset_peak_resident();
  ZERO_RETURN_IF_ERROR(comm.barrier().wait());
  ZERO_ASSIGN_OR_RETURN(StageRow row, run_stage(comm, options, stage));
  ZERO_RETURN_IF_ERROR(comm.barrier().wait());  // every rank's memory is in the peak
  return OffloadRow{.run = row, .offload = offload, .peak_resident = peak_resident_bytes()};
}

// The runs of one stage: none (the baseline), then offloaded to NVMe files for an engine on the CPU, to host memory
// for one on a device.
std::vector<Offload> offloads_of(int stage, Device device) {
  const Offload::To to = device.is_cpu() ? Offload::To::kFiles : Offload::To::kHost;
  std::vector<Offload> offloads = {{}, {.to = to}};
  if (StagePolicy(stage).partitions_params()) offloads.push_back({.to = to, .params = true});
  return offloads;
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
                     {"rank0_device_MiB", 2},
                     {"rank0_pinned_MiB", 2},
                     {"process_rss_MiB", 1}});
  double ram_ms = 0;
  for (const OffloadRow& r : rows) {
    if (r.offload.to == Offload::To::kNone) ram_ms = r.run.step_ms;
    table.add_row({int64_t{r.run.stage}, r.offload.name(), r.run.step_ms, r.run.step_ms / ram_ms,
                   mib(r.run.model_state_peak()), mib(r.run.formula_model_state), mib(r.run.in_files),
                   mib(r.run.formula_in_files), mib(r.run.memory.peak_total), mib(r.run.memory.device_peak),
                   mib(r.run.memory.pinned_peak), r.peak_resident < 0 ? 0.0 : mib(r.peak_resident)});
  }
  return table;
}

}  // namespace

absl::Status offload_command() {
  ZERO_ASSIGN_OR_RETURN(const StagesBenchOptions options, stages_options_from_flags());
  return run_on_ranks([&](Communicator& comm) -> absl::Status {
    std::vector<OffloadRow> rows;
    for (int stage : options.stages) {
      for (const Offload offload : offloads_of(stage, options.device)) {
        ZERO_ASSIGN_OR_RETURN(OffloadRow row, run_one(comm, options, stage, offload));
        rows.push_back(row);
      }
    }
    if (comm.rank() != 0) return absl::OkStatus();
    std::printf(
        "# zero-bench offload: %s, backend %s, %d ranks, warmup %d, iters %d, nvme_path %s\n"
        "# every unit sharded at stage 3 (persistence threshold 0); files: ZeRO-Infinity's NVMe offload; host: "
        "ZeRO-Offload's (an engine on a device); states_ram: rank 0's peak params+grads+master+optim in memory, the "
        "device's and the host's; in_files: its model states in files; formulas from shard/plan.h; rank0_device and "
        "rank0_pinned: of rank0_total, the peak on the device and in page-locked host memory; process_rss: peak "
        "resident memory of the whole process (all local ranks), page cache not included\n",
        describe_model(options).c_str(), std::string(comm.backend_name()).c_str(), comm.world_size(),
        options.reps.warmup, options.reps.iters, absl::GetFlag(FLAGS_nvme_path).c_str());
    const ResultTable table = offload_table(rows);
    std::fputs(table.to_text().c_str(), stdout);
    std::fflush(stdout);
    return write_csv_flag(table);
  });
}

}  // namespace zero
