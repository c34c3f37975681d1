// NVMe offload (ZeroConfig::offload_*_path): which states live in files, and paging them out of RAM.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "runtime/allocator.h"
#include "shard/unit_state.h"

namespace zero {

// offload_optimizer_path: the master weights and optimizer state the allocator hands out from now on
// live in files there. Nothing when `dir` is "".
absl::Status place_optimizer_in_files(Allocator& allocator, const std::string& dir);

// The unit's params as held: for a sharded unit (only stage 3's shards are offloaded; units kept whole stay where
// the engine is), in a file under `offload_param_dir` when it is set, or in pinned host memory under `to_host`;
// else on `device`.
absl::StatusOr<Buffer> allocate_held_params(const UnitState& u, Allocator& allocator, DType dtype, Device device,
                                            const std::string& offload_param_dir, bool to_host);

// Sends what of a unit is in files (params shard, master weights, optimizer state) back to them and
// drops it from RAM, once it has been written or read; nothing for what is in RAM. So RAM holds one
// unit's at a time.
absl::Status page_out_offloaded(const UnitState& u, Allocator& allocator);

}  // namespace zero
