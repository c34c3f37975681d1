// zero-bench optim: AdamW parameters/s on one CPU shard beside the memory-bandwidth bound and torch.optim.AdamW.
#pragma once

#include "absl/status/status.h"

namespace zero {

// The `optim` subcommand: --numel, --iters; prints the table and writes --csv. PyTorch is optional
// (/usr/bin/python3 with torch); without it the table has no torch rows.
absl::Status optim_command();

}  // namespace zero
