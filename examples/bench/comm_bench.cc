#include "examples/bench/comm_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/kernels.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

ABSL_FLAG(std::string, collectives, "allreduce,reduce_scatter,allgather,broadcast",
          "comm: comma list of the collectives to time, from allreduce, reduce_scatter, allgather, broadcast");
ABSL_FLAG(std::string, sizes, "4K,16K,64K,256K,1M,4M,16M,64M",
          "comm: comma list of payload sizes in bytes, K/M/G suffixes are powers of 1024. A payload is nccl-tests' "
          "size: the whole buffer, so the N chunks together for reduce_scatter and allgather. Each is rounded down "
          "to whole elements (to N equal chunks for reduce_scatter and allgather); the table shows what ran");

namespace zero {
namespace {

constexpr CollectiveOp kBenchmarked[] = {CollectiveOp::kAllreduce, CollectiveOp::kReduceScatter,
                                         CollectiveOp::kAllgather, CollectiveOp::kBroadcast};
constexpr int kMemcpyTrials = 5;
constexpr int64_t kMemcpyTrialBytes = int64_t{64} << 20;  // each trial copies at least this much
constexpr double kBytesPerGB = 1e9;

using Clock = std::chrono::steady_clock;

// Keeps the compiler from merging or dropping copies whose results nothing reads.
void clobber_memory() { asm volatile("" : : : "memory"); }

// Zeroed, so reductions stay finite however many times they run, and touched, so the timed loop is warm. On a
// GPU the zeroing has finished when this returns, so that no timed op waits for it.
absl::StatusOr<Buffer> zeroed(Allocator& allocator, int64_t bytes, MemoryCategory category, Device device) {
  ZERO_ASSIGN_OR_RETURN(Buffer buffer, allocator.allocate(bytes, category, device));
  if (bytes == 0) return buffer;
  ZERO_RETURN_IF_ERROR(kernels::fill_zero(buffer.tensor(DType::kU8, {bytes})));
  ZERO_RETURN_IF_ERROR(synchronize(device));
  return buffer;
}

// Returns once every rank reached it. A one-element allreduce rather than barrier(): the local backend's barrier
// lets a rank post its next collective before the peers compared fingerprints, which they then report as
// divergent ranks.
absl::Status start_line(Communicator& comm) {
  float token = 0;
  return comm.allreduce(Tensor(&token, DType::kF32, {1}), ReduceOp::kMax).wait();
}

Work issue(Communicator& comm, CollectiveOp op, Tensor input, Tensor output) {
  switch (op) {
    case CollectiveOp::kAllreduce: return comm.allreduce(output, ReduceOp::kSum);
    case CollectiveOp::kReduceScatter: return comm.reduce_scatter(input, output, ReduceOp::kSum);
    case CollectiveOp::kAllgather: return comm.allgather(input, output);
    case CollectiveOp::kBroadcast: return comm.broadcast(output, /*root=*/0);
    default: ZERO_CHECK(false, collective_op_name(op), " is not benchmarked");
  }
  return Work::completed();
}

// Seconds per op of `c` on this rank, its buffers on `device`: warm-up ops waited one by one, a start line every
// rank crosses together, then the timed ops issued back to back and waited for together, as nccl-tests launches
// its timed loop. The time includes the device's work: a device collective's Work completes once it is queued, and
// its wait() orders this thread's stream after it, so the device is synchronized before the clock is read (and
// after the warm-up, so that none of it is timed).
absl::StatusOr<double> time_collective(Communicator& comm, Allocator& allocator, Device device, const Collective& c,
                                       Repetitions reps) {
  const int64_t n = comm.world_size();
  const bool chunked = c.op == CollectiveOp::kReduceScatter || c.op == CollectiveOp::kAllgather;
  const int64_t input_count = c.op == CollectiveOp::kReduceScatter ? n * c.count : chunked ? c.count : 0;
  const int64_t output_count = c.op == CollectiveOp::kAllgather ? n * c.count : c.count;
  const int64_t element = static_cast<int64_t>(dtype_size(c.dtype));
  ZERO_ASSIGN_OR_RETURN(Buffer in, zeroed(allocator, input_count * element, MemoryCategory::kCommBuffers, device));
  ZERO_ASSIGN_OR_RETURN(Buffer out, zeroed(allocator, output_count * element, MemoryCategory::kCommBuffers, device));
  const Tensor input = in.tensor(c.dtype, {input_count});
  const Tensor output = out.tensor(c.dtype, {output_count});

  for (int i = 0; i < reps.warmup; ++i) ZERO_RETURN_IF_ERROR(issue(comm, c.op, input, output).wait());
  ZERO_RETURN_IF_ERROR(synchronize(device));
  ZERO_RETURN_IF_ERROR(start_line(comm));
  const Clock::time_point start = Clock::now();
  std::vector<Work> timed;
  timed.reserve(reps.iters);
  for (int i = 0; i < reps.iters; ++i) timed.push_back(issue(comm, c.op, input, output));
  for (const Work& work : timed) ZERO_RETURN_IF_ERROR(work.wait());
  ZERO_RETURN_IF_ERROR(synchronize(device));
  return seconds_since(start) / reps.iters;
}

absl::StatusOr<double> max_over_ranks(Communicator& comm, double value) {
  float v = static_cast<float>(value);
  ZERO_RETURN_IF_ERROR(comm.allreduce(Tensor(&v, DType::kF32, {1}), ReduceOp::kMax).wait());
  return v;
}

// Rank 0 measures memcpy on its device for each planned payload size; every rank gets its numbers, in plan order.
absl::StatusOr<std::vector<float>> memcpy_baselines(Communicator& comm, Allocator& allocator, Device device,
                                                    const std::vector<Collective>& plan) {
  std::vector<float> gbps(plan.size());
  if (comm.rank() == 0) {
    std::map<int64_t, double> by_bytes;
    for (size_t i = 0; i < plan.size(); ++i) {
      const int64_t bytes = payload_bytes(plan[i], comm.world_size());
      auto it = by_bytes.find(bytes);
      if (it == by_bytes.end()) {
        ZERO_ASSIGN_OR_RETURN(double measured, measure_memcpy_gbps(allocator, device, bytes));
        it = by_bytes.emplace(bytes, measured).first;
      }
      gbps[i] = static_cast<float>(it->second);
    }
  }
  const Tensor all(gbps.data(), DType::kF32, {static_cast<int64_t>(gbps.size())});
  ZERO_RETURN_IF_ERROR(comm.broadcast(all, /*root=*/0).wait());
  return gbps;
}

CommBenchRow make_row(const Collective& c, int world_size, double seconds, double memcpy_gbps) {
  CommBenchRow row;
  row.op = c.op;
  row.bytes = payload_bytes(c, world_size);
  row.count = row.bytes / static_cast<int64_t>(dtype_size(c.dtype));
  row.time_us = seconds * 1e6;
  row.algbw_gbps = static_cast<double>(row.bytes) / seconds / kBytesPerGB;
  row.busbw_gbps = row.algbw_gbps * bus_bandwidth_factor(c.op, world_size);
  row.memcpy_gbps = memcpy_gbps;
  return row;
}

}  // namespace

absl::StatusOr<std::vector<CollectiveOp>> parse_collective_list(absl::string_view list) {
  std::vector<CollectiveOp> ops;
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    const auto* found = std::find_if(std::begin(kBenchmarked), std::end(kBenchmarked),
                                     [&](CollectiveOp op) { return collective_op_name(op) == name; });
    if (found == std::end(kBenchmarked)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown collective '", name, "'; choose from ",
          absl::StrJoin(kBenchmarked, ", ",
                        [](std::string* out, CollectiveOp op) { absl::StrAppend(out, collective_op_name(op)); })));
    }
    ops.push_back(*found);
  }
  return ops;
}

double bus_bandwidth_factor(CollectiveOp op, int world_size) {
  const double n = world_size;
  switch (op) {
    case CollectiveOp::kAllreduce: return 2 * (n - 1) / n;
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllgather: return (n - 1) / n;
    default: return 1;
  }
}

absl::StatusOr<Collective> shape_collective(CollectiveOp op, int64_t bytes, DType dtype, int world_size) {
  const bool chunked = op == CollectiveOp::kReduceScatter || op == CollectiveOp::kAllgather;
  const int64_t unit = static_cast<int64_t>(dtype_size(dtype)) * (chunked ? world_size : 1);
  if (bytes < unit) {
    return absl::InvalidArgumentError(absl::StrCat("a payload of ", bytes, " bytes is too small for ",
                                                   collective_op_name(op), " of ", dtype_name(dtype),
                                                   chunked ? absl::StrCat(" on ", world_size, " ranks") : "",
                                                   ": it needs at least ", unit, " bytes; raise --sizes"));
  }
  Collective c;
  c.op = op;
  c.dtype = dtype;
  c.count = bytes / unit;
  return c;
}

absl::StatusOr<double> measure_memcpy_gbps(Allocator& allocator, Device device, int64_t bytes) {
  ZERO_ASSIGN_OR_RETURN(Buffer src, zeroed(allocator, bytes, MemoryCategory::kWorkspace, device));
  ZERO_ASSIGN_OR_RETURN(Buffer dst, zeroed(allocator, bytes, MemoryCategory::kWorkspace, device));
  const int64_t copies = std::max<int64_t>(1, kMemcpyTrialBytes / bytes);
  double best = std::numeric_limits<double>::infinity();
  for (int trial = 0; trial < kMemcpyTrials; ++trial) {
    const Clock::time_point start = Clock::now();
    for (int64_t i = 0; i < copies; ++i) {
      ZERO_RETURN_IF_ERROR(copy_bytes(dst.data(), device, src.data(), device, static_cast<size_t>(bytes)));
      clobber_memory();
    }
    // A device-to-device cudaMemcpy may return before the copy finished.
    ZERO_RETURN_IF_ERROR(synchronize(device));
    best = std::min(best, seconds_since(start));
  }
  return static_cast<double>(bytes) * static_cast<double>(copies) / best / kBytesPerGB;
}

absl::StatusOr<std::vector<CommBenchRow>> run_comm_bench(Communicator& comm, const CommBenchOptions& options) {
  std::vector<Collective> plan;
  for (CollectiveOp op : options.collectives) {
    for (int64_t size : options.sizes) {
      ZERO_ASSIGN_OR_RETURN(Collective c, shape_collective(op, size, options.dtype, comm.world_size()));
      plan.push_back(c);
    }
  }
  Allocator allocator(comm.rank());
  const Device device = rank_device(comm, options.device);
  ZERO_ASSIGN_OR_RETURN(std::vector<float> memcpy_gbps, memcpy_baselines(comm, allocator, device, plan));
  std::vector<CommBenchRow> rows;
  for (size_t i = 0; i < plan.size(); ++i) {
    ZERO_ASSIGN_OR_RETURN(double mine, time_collective(comm, allocator, device, plan[i], options.reps));
    ZERO_ASSIGN_OR_RETURN(double slowest, max_over_ranks(comm, mine));
    rows.push_back(make_row(plan[i], comm.world_size(), slowest, memcpy_gbps[i]));
  }
  return rows;
}

ResultTable comm_bench_table(const std::vector<CommBenchRow>& rows) {
  ResultTable table({{"collective"},
                     {"size"},
                     {"count"},
                     {"time_us", 2},
                     {"algbw_GB/s", 3},
                     {"busbw_GB/s", 3},
                     {"memcpy_GB/s", 3},
                     {"busbw/memcpy", 4}});
  for (const CommBenchRow& r : rows) {
    table.add_row({std::string(collective_op_name(r.op)), r.bytes, r.count, r.time_us, r.algbw_gbps, r.busbw_gbps,
                   r.memcpy_gbps, r.busbw_gbps / r.memcpy_gbps});
  }
  return table;
}

absl::Status comm_command() {
  CommBenchOptions options;
  absl::StatusOr<std::vector<CollectiveOp>> collectives = parse_collective_list(absl::GetFlag(FLAGS_collectives));
  if (!collectives.ok()) return flag_error("collectives", collectives.status().message());
  absl::StatusOr<std::vector<int64_t>> sizes = parse_size_list(absl::GetFlag(FLAGS_sizes));
  if (!sizes.ok()) return flag_error("sizes", sizes.status().message());
  options.collectives = *std::move(collectives);
  options.sizes = *std::move(sizes);
  ZERO_ASSIGN_OR_RETURN(options.dtype, dtype_flag());
  ZERO_ASSIGN_OR_RETURN(options.reps, repetitions_flags());
  ZERO_ASSIGN_OR_RETURN(options.device, device_flag());
  return run_on_ranks([&](Communicator& comm) -> absl::Status {
    ZERO_ASSIGN_OR_RETURN(std::vector<CommBenchRow> rows, run_comm_bench(comm, options));
    if (comm.rank() != 0) return absl::OkStatus();
    const ResultTable table = comm_bench_table(rows);
    const Device device = rank_device(comm, options.device);
    std::printf(
        "# zero-bench comm: backend %s, %d ranks, %s, warmup %d, iters %d; time per op is the max over ranks\n"
        "# buffers: rank 0's on %s; memcpy: rank 0's %s of the payload there\n",
        std::string(comm.backend_name()).c_str(), comm.world_size(), std::string(dtype_name(options.dtype)).c_str(),
        options.reps.warmup, options.reps.iters, device.to_string().c_str(),
        device.is_cpu() ? "single-thread memcpy" : "device-to-device copy");
    std::fputs(table.to_text().c_str(), stdout);
    std::fflush(stdout);
    return write_csv_flag(table);
  });
}

}  // namespace zero
