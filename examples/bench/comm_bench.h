// zero-bench comm: time per collective and size, algbw and busbw as nccl-tests computes them, beside a copy on the
// same device.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "examples/bench/bench_common.h"
#include "examples/common/result_table.h"
#include "runtime/allocator.h"
#include "runtime/comm/collective.h"
#include "runtime/comm/communicator.h"
#include "runtime/dtype.h"

namespace zero {

struct CommBenchOptions {
  std::vector<CollectiveOp> collectives;
  std::vector<int64_t> sizes;  // requested payload bytes (nccl-tests' size)
  DType dtype = DType::kF32;
  Repetitions reps;
  Device device = Device::cpu();  // --device's: cuda:0 for every local rank on the GPU (see rank_device)
};

// One measured (collective, size). Every rank computes the same row.
struct CommBenchRow {
  CollectiveOp op = CollectiveOp::kAllreduce;
  int64_t bytes = 0;       // payload_bytes() of what ran: the request rounded down to whole elements (N chunks)
  int64_t count = 0;       // elements in the payload: bytes / dtype size
  double time_us = 0;      // timed loop / iters, the max over ranks
  double algbw_gbps = 0;   // bytes / time, 1e9 bytes per GB
  double busbw_gbps = 0;   // algbw * bus_bandwidth_factor
  double memcpy_gbps = 0;  // rank 0's copy of `bytes` on its device (measure_memcpy_gbps), warm, best of several
};

// "allreduce,allgather" -> ops; the names are collective_op_name()'s, and only the four benchmarked ones.
absl::StatusOr<std::vector<CollectiveOp>> parse_collective_list(absl::string_view list);

// nccl-tests' busbw / algbw for N ranks: 2(N-1)/N for allreduce, (N-1)/N for reduce_scatter and allgather,
// 1 for broadcast. busbw is then comparable with the link (here: memory) bandwidth whatever N is.
double bus_bandwidth_factor(CollectiveOp op, int world_size);

// The collective (op, dtype, per-rank count; no buffers) whose payload is `bytes` rounded down to whole
// elements, and for reduce_scatter and allgather to N equal chunks. InvalidArgument when that is empty.
absl::StatusOr<Collective> shape_collective(CollectiveOp op, int64_t bytes, DType dtype, int world_size);

// Copy bandwidth of `bytes` on `device` in GB/s (bytes copied / time): a single-thread memcpy on the CPU, a
// device-to-device copy on a GPU, the bound a local collective's copies meet; buffers warmed by zeroing, best of
// several trials.
absl::StatusOr<double> measure_memcpy_gbps(Allocator& allocator, Device device, int64_t bytes);

// Runs on every rank of `comm`: times each (collective, size) in order, collectives outermost.
absl::StatusOr<std::vector<CommBenchRow>> run_comm_bench(Communicator& comm, const CommBenchOptions& options);

// collective, size, count, time_us, algbw_GB/s, busbw_GB/s, memcpy_GB/s, busbw/memcpy.
ResultTable comm_bench_table(const std::vector<CommBenchRow>& rows);

// The `comm` subcommand: reads the flags, runs on --backend, prints the table on rank 0, writes --csv.
absl::Status comm_command();

}  // namespace zero
