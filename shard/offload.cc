// NVMe offload: placing the optimizer and the parameter shards in files, and paging a unit's out.
#include "shard/offload.h"

#include "absl/strings/str_cat.h"
#include "runtime/device_api.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

namespace zero {

absl::Status place_optimizer_in_files(Allocator& allocator, const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  for (MemoryCategory category : {MemoryCategory::kOptimizerState, MemoryCategory::kMasterWeights}) {
    const absl::Status placed = allocator.place_in_files(category, dir);
    if (!placed.ok()) {
      return absl::Status(placed.code(), absl::StrCat("offloading the optimizer to ", dir, ": ", placed.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Buffer> allocate_held_params(const UnitState& u, Allocator& allocator, DType dtype, Device device,
                                            const std::string& offload_param_dir, bool to_host) {
  const int64_t nbytes = u.held_numel * static_cast<int64_t>(dtype_size(dtype));
  if (!u.sharded || nbytes == 0) return allocator.allocate(nbytes, MemoryCategory::kParams, device);
  if (to_host) {  // page-locked, so the copy to the device for each gather runs beside the host
    DeviceApi* api = device_api(device);
    if (api == nullptr) return absl::InvalidArgumentError("parameter shards in host memory need an engine on a device");
    return allocator.allocate_pinned(*api, nbytes, MemoryCategory::kParams);
  }
  if (offload_param_dir.empty()) return allocator.allocate(nbytes, MemoryCategory::kParams, device);
  absl::StatusOr<Buffer> in_file = allocator.allocate_in_file(nbytes, MemoryCategory::kParams, offload_param_dir);
  if (in_file.ok()) return in_file;
  return absl::Status(in_file.status().code(), absl::StrCat("offloading the parameters to ", offload_param_dir, ": ",
                                                            in_file.status().message()));
}

absl::Status page_out_offloaded(const UnitState& u, Allocator& allocator) {
  ZERO_RETURN_IF_ERROR(allocator.page_out(u.params.data()));
  ZERO_RETURN_IF_ERROR(allocator.page_out(u.master.data()));
  for (const auto& [name, state] : u.optimizer->state()) ZERO_RETURN_IF_ERROR(allocator.page_out(state.data()));
  return absl::OkStatus();
}

}  // namespace zero
