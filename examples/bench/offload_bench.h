// zero-bench offload: one GPT-2 per stage in RAM, with its optimizer in NVMe files, and at stage 3 its parameters too.
#pragma once

#include "absl/status/status.h"

namespace zero {

// The `offload` subcommand: the stages flags (--model, --stages, --batch, --seq, --dtype, --warmup,
// --iters) plus --nvme_path; prints, per stage, the run in RAM and the offloaded runs (the optimizer; at
// stage 3 also the parameter shards): model states in RAM and in files beside shard/plan.h, the
// process's peak resident memory, step time against the RAM run's; on rank 0, and writes --csv.
absl::Status offload_command();

}  // namespace zero
