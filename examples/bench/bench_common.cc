#include "examples/bench/bench_common.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/comm/local.h"
#include "runtime/status.h"
#ifdef ZERO_HAS_MPI
#include "runtime/comm/mpi.h"
#endif
#ifdef ZERO_HAS_NCCL
#include "runtime/comm/nccl.h"
#endif

ABSL_FLAG(std::string, backend, "local",
          "Communicator backend: `local` runs --ranks ranks as threads of this process; `mpi` runs one rank per "
          "process, started with `mpirun -np N zero-bench ...` (only in builds with MPI); `nccl` runs --ranks ranks "
          "as threads of this process, rank r on cuda:r (with --device=cuda, only in builds with NCCL)");
ABSL_FLAG(int, ranks, 4,
          "Number of ranks for --backend=local or nccl (>= 1; nccl needs a GPU per rank); under mpi the world size "
          "is mpirun's -np");
ABSL_FLAG(std::string, device, "cpu",
          "Where the buffers (comm) or the engines and the model (stages, offload) live: cpu; cuda (a CUDA build "
          "with a GPU; local ranks share cuda:0, nccl ranks take cuda:0 to cuda:N-1); or sim, the simulated "
          "device (the GPU path with its ordering checked, on the CPU: for correctness, not speed)");
ABSL_FLAG(std::string, dtype, "fp32", "Element type of the benchmarked buffers: fp32, bf16 or fp16");
ABSL_FLAG(int, warmup, 5, "Untimed iterations before each timed loop (>= 0)");
ABSL_FLAG(int, iters, 20,
          "Timed iterations per measurement (>= 1): stages and offload report the median step, the others a time per "
          "op as the loop's wall time / iters");
ABSL_FLAG(
    std::string, python, "",
    "optim, stages --torch: the Python whose PyTorch is the baseline; default: $ZERO_BENCH_PYTHON, else the project's "
    ".venv-bench (scripts/bench_venv.sh: the newest PyTorch from PyPI), else python3 on PATH");
ABSL_FLAG(std::string, csv, "", "Also write the result rows, with the table's columns, to this CSV file (rank 0)");

namespace zero {
namespace {

absl::StatusOr<int64_t> parse_size(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  int64_t unit = 1;
  if (!text.empty()) {
    switch (absl::ascii_toupper(text.back())) {
      case 'K': unit = int64_t{1} << 10; break;
      case 'M': unit = int64_t{1} << 20; break;
      case 'G': unit = int64_t{1} << 30; break;
      default: break;
    }
  }
  absl::string_view digits = unit == 1 ? text : text.substr(0, text.size() - 1);
  int64_t value = 0;
  if (!absl::SimpleAtoi(digits, &value) || value <= 0 || value > (int64_t{1} << 50) / unit) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a positive byte count; write sizes like 4096, 4K, 1M or 2G"));
  }
  return value * unit;
}

// nccl drives a GPU per rank: it needs a build with NCCL, and the buffers on the GPUs.
absl::Status check_nccl_flags() {
#ifdef ZERO_HAS_NCCL
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cuda") return absl::OkStatus();
  return flag_error("backend", absl::StrCat("nccl runs every rank on a GPU, but --device is '", device,
                                            "'; add --device=cuda, or use --backend=local on the CPU"));
#else
  return flag_error("backend",
                    "nccl: this zero-bench was built without NCCL; install the CUDA toolkit and NCCL (libnccl-dev) "
                    "and reconfigure with -DZERO_WITH_CUDA=ON -DZERO_WITH_NCCL=ON, or use --backend=local");
#endif
}

}  // namespace

absl::Status flag_error(absl::string_view flag, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", message));
}

absl::StatusOr<std::vector<int64_t>> parse_size_list(absl::string_view list) {
  std::vector<int64_t> sizes;
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    ZERO_ASSIGN_OR_RETURN(int64_t size, parse_size(item));
    sizes.push_back(size);
  }
  return sizes;
}

absl::Status check_backend_flags() {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "mpi") {
#ifdef ZERO_HAS_MPI
    return absl::OkStatus();
#else
    return flag_error("backend",
                      "mpi: this zero-bench was built without MPI; install libopenmpi-dev and "
                      "reconfigure with -DZERO_WITH_MPI=ON, or use --backend=local");
#endif
  }
  if (backend == "nccl") ZERO_RETURN_IF_ERROR(check_nccl_flags());
  if (backend != "local" && backend != "nccl") {
    return flag_error("backend", absl::StrCat("unknown backend '", backend, "'; use local, mpi or nccl"));
  }
  const int ranks = absl::GetFlag(FLAGS_ranks);
  if (ranks < 1) return flag_error("ranks", absl::StrCat(ranks, " ranks requested; give at least 1"));
  return absl::OkStatus();
}

absl::Status run_on_ranks(const std::function<absl::Status(Communicator&)>& fn) {
  ZERO_RETURN_IF_ERROR(check_backend_flags());
  const std::string backend = absl::GetFlag(FLAGS_backend);
#ifdef ZERO_HAS_MPI
  if (backend == "mpi") {
    // A failing rank prints its error and aborts the job inside run_mpi_rank; a non-zero return is what is left.
    const int exit_code = run_mpi_rank(fn);
    if (exit_code != 0) return absl::InternalError(absl::StrCat("the mpi rank ended with exit code ", exit_code));
    return absl::OkStatus();
  }
#endif
#ifdef ZERO_HAS_NCCL
  if (backend == "nccl") return root_cause(run_nccl_ranks_in_process(absl::GetFlag(FLAGS_ranks), fn));
#endif
  return root_cause(run_local_ranks(absl::GetFlag(FLAGS_ranks), fn));
}

absl::StatusOr<Device> device_flag() {
  const std::string name = absl::GetFlag(FLAGS_device);
  if (name == "cpu") return Device::cpu();
  if (name == "sim") return Device::sim(0);  // the GPU path, checked, on the CPU: for correctness, not speed
  if (name != "cuda") return flag_error("device", absl::StrCat("'", name, "' is not cpu, cuda or sim"));
  if (const absl::Status gpu = check_cuda_device(0); !gpu.ok()) {
    return flag_error("device", absl::StrCat("cuda needs a GPU: ", gpu.message(), ", or use --device=cpu"));
  }
  return Device::cuda(0);
}

Device rank_device(const Communicator& comm, Device device) {
  return comm.home_device().is_cuda() ? comm.home_device() : device;
}

absl::StatusOr<DType> dtype_flag() {
  const std::string name = absl::GetFlag(FLAGS_dtype);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (name == dtype_name(t)) return t;
  }
  return flag_error("dtype", absl::StrCat("unknown dtype '", name, "'; use fp32, bf16 or fp16"));
}

absl::StatusOr<Repetitions> repetitions_flags() {
  const Repetitions r{absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_iters)};
  if (r.warmup < 0) return flag_error("warmup", absl::StrCat(r.warmup, " is negative; give 0 or more"));
  if (r.iters < 1) return flag_error("iters", absl::StrCat(r.iters, " timed iterations; give at least 1"));
  return r;
}

absl::Status write_csv_flag(const ResultTable& table) {
  const std::string path = absl::GetFlag(FLAGS_csv);
  if (path.empty()) return absl::OkStatus();
  std::ofstream out(path, std::ios::trunc);
  if (out) out << table.to_csv();
  if (!out.flush()) {
    return flag_error("csv", absl::StrCat("cannot write '", path, "': ", std::strerror(errno),
                                          "; check that its directory exists and is writable"));
  }
  return absl::OkStatus();
}

}  // namespace zero
