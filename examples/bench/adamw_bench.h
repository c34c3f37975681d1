// Measures CPU AdamW throughput on one big shard beside a memory-bandwidth bound taken in the same run.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace zero {

struct AdamWBenchResult {
  int64_t numel = 0;
  int threads = 0;                           // OpenMP threads used by both measurements
  double params_per_second = 0;              // zero's AdamW step
  double copy_bytes_per_second = 0;          // best parallel copy, counting bytes read + written
  static constexpr int kBytesPerParam = 28;  // reads p, g, m, v; writes p, m, v (fp32)
  double bound_params_per_second() const { return copy_bytes_per_second / kBytesPerParam; }
};

// Times `iterations` AdamW steps (after one warm-up step) on a `numel`-element shard, and the best of
// `iterations` parallel memcpys of a same-sized buffer, for `zero-bench optim`.
absl::StatusOr<AdamWBenchResult> bench_adamw_cpu(int64_t numel, int iterations);

}  // namespace zero
