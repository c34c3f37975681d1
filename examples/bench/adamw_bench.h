// Measures CPU AdamW throughput on one big shard beside the memory bound of its own traffic, taken in the same run.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace zero {

struct AdamWBenchResult {
  int64_t numel = 0;
  int threads = 0;                           // OpenMP threads used by both measurements
  double params_per_second = 0;              // zero's AdamW, at its median step
  double bound_params_per_second = 0;        // the best pass of AdamW's traffic with next to no arithmetic
  static constexpr int kBytesPerParam = 28;  // reads p, g, m, v; writes p, m, v (fp32), each line once
  double bound_bytes_per_second() const { return bound_params_per_second * kBytesPerParam; }
};

// Times `iterations` AdamW steps (after one warm-up step; the median counts) on a `numel`-element shard, and the best
// of `iterations` passes of the same traffic (read p, g, m, v; write p, m, v in place) split over the same threads, for
// `zero-bench optim`. A copy is no bound: its destination's lines are read before they are written (12 bytes moved per
// 8 counted), where AdamW writes only lines it has read.
absl::StatusOr<AdamWBenchResult> bench_adamw_cpu(int64_t numel, int iterations);

}  // namespace zero
