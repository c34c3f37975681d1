// What zero-bench's subcommands share: the common flags, running a function on every rank, parsing sizes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "examples/common/result_table.h"
#include "runtime/comm/communicator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(int, ranks);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(int, warmup);
ABSL_DECLARE_FLAG(int, iters);
ABSL_DECLARE_FLAG(std::string, csv);
ABSL_DECLARE_FLAG(std::string, python);

namespace zero {

// The timing loop's shape, from --warmup and --iters.
struct Repetitions {
  int warmup = 0;
  int iters = 1;
};

// Wall seconds since `start` on the steady clock, the benchmarks' one timer.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Bytes in MiB, for the tables.
inline double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// InvalidArgument "--<flag>: <message>".
absl::Status flag_error(absl::string_view flag, absl::string_view message);

// Checks --backend and --ranks (and that nccl has --device=cuda) without running anything, so a bad value
// fails before any work starts.
absl::Status check_backend_flags();
// Runs fn once per rank of --backend: --ranks threads of this process for `local`, this process's rank
// under mpirun for `mpi`, --ranks threads of this process with a GPU each for `nccl` (as zero-train's
// one process driving N GPUs). Returns the status that explains a failed run (see root_cause in local.h).
absl::Status run_on_ranks(const std::function<absl::Status(Communicator&)>& fn);

// --device: cpu, or cuda:0; cuda without a visible GPU (or in a build without CUDA) is refused naming the flag.
absl::StatusOr<Device> device_flag();
// Where `comm`'s rank puts its buffers given device_flag()'s device: its own GPU under nccl, which runs a
// rank per GPU; that device otherwise (local ranks share cuda:0).
Device rank_device(const Communicator& comm, Device device);

// --dtype: fp32, bf16 or fp16.
absl::StatusOr<DType> dtype_flag();
// --warmup (>= 0) and --iters (>= 1).
absl::StatusOr<Repetitions> repetitions_flags();

// "4K,1M,64M" -> bytes; suffixes K, M and G are powers of 1024; every size must be positive.
absl::StatusOr<std::vector<int64_t>> parse_size_list(absl::string_view list);

// Writes the table to --csv when it is set; does nothing otherwise.
absl::Status write_csv_flag(const ResultTable& table);

}  // namespace zero
