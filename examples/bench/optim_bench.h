// zero-bench optim: AdamW parameters/s on one CPU shard beside the bound of its memory traffic and torch.optim.AdamW.
#pragma once

#include "absl/status/status.h"

namespace zero {

// The `optim` subcommand: --numel, --iters, --python; prints the table and writes --csv. PyTorch is optional
// (examples/common/bench_python.h picks the Python); without it the table has no torch rows.
absl::Status optim_command();

}  // namespace zero
