// zero-bench kernels: CPU kernel throughput (matmul GFLOP/s, elementwise GB/s) beside raw cblas_sgemm and memcpy.
#pragma once

#include "absl/status/status.h"

namespace zero {

// The `kernels` subcommand: --kernels, --tokens, --warmup, --iters; prints the table and writes --csv.
// Matmul and attention are measured beside one raw cblas_sgemm (OpenBLAS threading itself over the same
// threads), memory-bound kernels beside a parallel memcpy of the bytes they read plus write.
absl::Status kernels_command();

}  // namespace zero
