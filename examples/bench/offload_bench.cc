// zero-bench offload: per stage, the same training steps in RAM, with the optimizer in NVMe files or (an engine on a
// device) in host memory, and at stage 3 with the parameter shards too.
#include "examples/bench/offload_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "examples/bench/bench_common.h"
#include "examples/bench/stages_bench.h"
#include "examples/common/median.h"
#include "runtime/device_api.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"
#include "shard/stage.h"

ABSL_FLAG(std::string, nvme_path, std::filesystem::temp_directory_path().string(),
          "offload: directory for the offloaded states' files (a fast local drive)");
ABSL_FLAG(int, swap_buffers, 8,
          "offload: the pipelined files rows' offload_optimizer.buffer_count (optimizer tensors RAM holds at once)");

namespace zero {
namespace {

using Clock = std::chrono::steady_clock;

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

// Writes `bytes` from `data` to a new file at `path` in 4 MiB pieces, flushes it to the drive, and reads it back.
absl::Status write_and_read_back(const std::string& path, void* data, int64_t bytes) {
  constexpr int64_t kPiece = int64_t{4} << 20;
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  absl::Cleanup close_it = [fd] { ::close(fd); };
  char* p = static_cast<char*>(data);
  for (int64_t done = 0; done < bytes;) {
    const ssize_t n = ::pwrite(fd, p + done, std::min(kPiece, bytes - done), done);
    if (n <= 0) return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
    done += n;
  }
  if (::fdatasync(fd) != 0) return absl::InternalError(absl::StrCat("fdatasync ", path, ": ", std::strerror(errno)));
  for (int64_t done = 0; done < bytes;) {
    const ssize_t n = ::pread(fd, p + done, std::min(kPiece, bytes - done), done);
    if (n <= 0) return absl::InternalError(absl::StrCat("read ", path, ": ", std::strerror(errno)));
    done += n;
  }
  return absl::OkStatus();
}

// Where a run keeps what it offloads: nowhere, NVMe files (ZeRO-Infinity), or host memory beside a device engine
// (ZeRO-Offload); the optimizer (master weights and state), or at stage 3 the parameter shards too.
// Files' transfers are paced as DeepSpeed's defaults do (one unit at a time, each read at its update and written
// before the next), or pipelined (read ahead and written behind, --swap_buffers tensors in RAM).
struct Offload {
  enum class To { kNone, kFiles, kHost };
  To to = To::kNone;
  bool params = false;
  bool pipelined = false;

  std::string name() const {
    if (to == To::kNone) return "none";
    return absl::StrCat(to == To::kFiles ? "files:" : "host:", params ? "optimizer+params" : "optimizer",
                        pipelined ? "/pipelined" : "");
  }
};

struct OffloadRow {
  StageRow run;
  Offload offload;
  int64_t peak_resident = 0;  // the process's, over this run
  double plain_ms = 0;        // plain_transfer_ms of what the run moves per step
};

// Milliseconds a plain transfer of `bytes` takes where `offload` moves them, measured now (the median of three after
// one unmeasured): for files, a sequential write of a file that size in --nvme_path, flushed to the drive, and a
// read of it back; for host memory, half of it copied from pinned host memory to `device` and half back. 0 when
// nothing is moved.
absl::StatusOr<double> plain_transfer_ms(const Offload& offload, int64_t bytes, Device device) {
  if (offload.to == Offload::To::kNone || bytes == 0) return 0.0;
  std::function<absl::Status()> once;
  Allocator allocator;
  Buffer host, on_device;
  const std::string path = absl::StrCat(absl::GetFlag(FLAGS_nvme_path), "/zero-bench-plain-io");
  if (offload.to == Offload::To::kFiles) {
    ZERO_ASSIGN_OR_RETURN(host, allocator.allocate(bytes, MemoryCategory::kWorkspace));
    once = [&] { return write_and_read_back(path, host.data(), bytes); };
  } else {
    DeviceApi* api = device_api(device);
    const int64_t half = bytes / 2;
    ZERO_ASSIGN_OR_RETURN(host, allocator.allocate_pinned(*api, half, MemoryCategory::kWorkspace));
    ZERO_ASSIGN_OR_RETURN(on_device, allocator.allocate(half, MemoryCategory::kWorkspace, device));
    once = [&, api, half]() -> absl::Status {
      const Stream stream = Stream::legacy(device.index);
      ZERO_RETURN_IF_ERROR(api->copy_async(on_device.data(), host.data(), half, stream));
      ZERO_RETURN_IF_ERROR(api->copy_async(host.data(), on_device.data(), half, stream));
      return api->synchronize(stream);
    };
  }
  std::vector<double> seconds;
  for (int k = 0; k < 4; ++k) {
    const Clock::time_point start = Clock::now();
    ZERO_RETURN_IF_ERROR(once());
    if (k > 0) seconds.push_back(seconds_since(start));
  }
  std::filesystem::remove(path);
  return 1e3 * median(seconds);
}

absl::StatusOr<OffloadRow> run_one(Communicator& comm, StagesBenchOptions options, int stage, Offload offload) {
  const std::string dir = absl::GetFlag(FLAGS_nvme_path);
  const bool files = offload.to == Offload::To::kFiles, host = offload.to == Offload::To::kHost;
  options.offload_optimizer_path = files ? dir : "";
  options.offload_param_path = files && offload.params ? dir : "";
  if (offload.pipelined) {
    options.optimizer_swap = {
        .buffer_count = absl::GetFlag(FLAGS_swap_buffers), .pipeline_read = true, .pipeline_write = true};
  }
  options.offload_optimizer_to_host = host;
  options.offload_param_to_host = host && offload.params;
  options.persistence_threshold = 0;  // every unit sharded at stage 3, as the formulas assume
  ZERO_RETURN_IF_ERROR(comm.barrier().wait());
  if (comm.rank() == 0) reset_peak_resident();
  ZERO_RETURN_IF_ERROR(comm.barrier().wait());
  ZERO_ASSIGN_OR_RETURN(StageRow row, run_stage(comm, options, stage));
  ZERO_RETURN_IF_ERROR(comm.barrier().wait());  // every rank's memory is in the peak
  OffloadRow out{.run = row, .offload = offload, .peak_resident = peak_resident_bytes()};
  if (comm.rank() == 0) {  // alone, after the run: the baseline measured in the same process, on the same drive
    // Every rank's bytes: local ranks share the drive (or the host-device link) and the step waits for the slowest.
    ZERO_ASSIGN_OR_RETURN(out.plain_ms,
                          plain_transfer_ms(offload, row.formula_offload_traffic * comm.world_size(), options.device));
  }
  ZERO_RETURN_IF_ERROR(comm.barrier().wait());
  return out;
}

// The runs of one stage: none (the baseline), then offloaded to NVMe files for an engine on the CPU, to host memory
// for one on a device.
std::vector<Offload> offloads_of(int stage, Device device) {
  const Offload::To to = device.is_cpu() ? Offload::To::kFiles : Offload::To::kHost;
  const bool files = to == Offload::To::kFiles;  // files' rows are also pipelined
  std::vector<Offload> offloads = {{}, {.to = to}};
  if (files) offloads.push_back({.to = to, .pipelined = true});
  if (StagePolicy(stage).partitions_params()) offloads.push_back({.to = to, .params = true, .pipelined = files});
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
                     {"process_rss_MiB", 1},
                     {"moved_MiB", 2},
                     {"extra_ms", 1},
                     {"plain_ms", 1}});
  double ram_ms = 0;
  for (const OffloadRow& r : rows) {
    if (r.offload.to == Offload::To::kNone) ram_ms = r.run.step_ms;
    table.add_row({int64_t{r.run.stage}, r.offload.name(), r.run.step_ms, r.run.step_ms / ram_ms,
                   mib(r.run.model_state_peak()), mib(r.run.formula_model_state), mib(r.run.in_files),
                   mib(r.run.formula_in_files), mib(r.run.memory.peak_total), mib(r.run.memory.device_peak),
                   mib(r.run.memory.pinned_peak), r.peak_resident < 0 ? 0.0 : mib(r.peak_resident),
                   mib(r.run.formula_offload_traffic), r.run.step_ms - ram_ms, r.plain_ms});
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
        "resident memory of the whole process (all local ranks), page cache not included; moved: what rank 0 moves "
        "per step to and from where its states are offloaded (each byte in files read and written once; host: "
        "gradients out, parameters in, host shards in for each gather); extra_ms: the step time above the first run's; "
        "plain_ms: a plain transfer of every rank's moved bytes (they share the drive or the link) measured in the "
        "same run (files: a sequential write, flushed, and read back of a file that size; host: pinned host to "
        "device and back), so extra_ms below it means the transfers overlap compute\n",
        describe_model(options).c_str(), std::string(comm.backend_name()).c_str(), comm.world_size(),
        options.reps.warmup, options.reps.iters, absl::GetFlag(FLAGS_nvme_path).c_str());
    const ResultTable table = offload_table(rows);
    std::fputs(table.to_text().c_str(), stdout);
    std::fflush(stdout);
    return write_csv_flag(table);
  });
}

}  // namespace zero
