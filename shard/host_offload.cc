#include "shard/host_offload.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

namespace zero {
namespace {

// The transfer buffers are the staging of copies between host and device, as the communication buffers are of
// collectives.
constexpr MemoryCategory kCategory = MemoryCategory::kCommBuffers;

int64_t own_bytes(const UnitState& u, DType dtype) { return u.own_count * static_cast<int64_t>(dtype_size(dtype)); }

}  // namespace

absl::StatusOr<HostOffload> HostOffload::create(std::vector<UnitState>& units, DType dtype, Device device,
                                                Allocator& allocator) {
  DeviceApi* api = device_api(device);
  if (api == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("offloading the optimizer to host memory needs an engine on a device, not ", device.to_string()));
  }
  ZERO_ASSIGN_OR_RETURN(OwnedStream transfer, OwnedStream::create(*api, device.index, StreamFlags::kNonBlocking));
  ZERO_ASSIGN_OR_RETURN(OwnedEvent marker, OwnedEvent::create(*api, device.index));
  std::vector<PerUnit> per_unit;
  per_unit.reserve(units.size());
  for (const UnitState& u : units) {
    // Empty for a rank whose range of the unit is empty, and for params living in host memory themselves.
    ZERO_ASSIGN_OR_RETURN(Buffer grads_out, allocator.allocate_pinned(*api, own_bytes(u, dtype), kCategory));
    ZERO_ASSIGN_OR_RETURN(Buffer params_in, allocator.allocate_pinned(
                                                *api, u.params.device().is_cpu() ? 0 : own_bytes(u, dtype), kCategory));
    ZERO_ASSIGN_OR_RETURN(OwnedEvent copied_out, OwnedEvent::create(*api, device.index));
    ZERO_ASSIGN_OR_RETURN(OwnedEvent copied_in, OwnedEvent::create(*api, device.index));
    per_unit.push_back({.grads_out = std::move(grads_out),
                        .params_in = std::move(params_in),
                        .copied_out = std::move(copied_out),
                        .copied_in = std::move(copied_in)});
  }
  return HostOffload(units, dtype, device, *api, std::move(transfer), std::move(marker), std::move(per_unit));
}

HostOffload::HostOffload(std::vector<UnitState>& units, DType dtype, Device device, DeviceApi& api,
                         OwnedStream transfer, OwnedEvent compute_marker, std::vector<PerUnit> per_unit)
    : units_(&units), dtype_(dtype), device_(device), api_(&api), transfer_(std::move(transfer)),
      compute_marker_(std::move(compute_marker)), per_unit_(std::move(per_unit)) {}

HostOffload::~HostOffload() {
  if (transfer_.owns()) (void)api_->synchronize(transfer_.get());  // after a device failure nothing is in flight
}

absl::Status HostOffload::gradients_final(int i) {
  PerUnit& p = per_unit_[i];
  const Tensor grads = (*units_)[i].own_grads(dtype_);
  if (grads.nbytes() > 0) {
    // After the kernels that wrote the gradient (queued on the current stream before this call).
    ZERO_RETURN_IF_ERROR(order_after(*api_, transfer_.get(), current_stream(device_), compute_marker_.get()));
    ZERO_RETURN_IF_ERROR(api_->copy_async(p.grads_out.data(), grads.data(), grads.nbytes(), transfer_.get()));
    ZERO_RETURN_IF_ERROR(api_->record(p.copied_out.get(), transfer_.get()));
  }
  p.streamed = true;
  return absl::OkStatus();
}

absl::Status HostOffload::stream_remaining_gradients() {
  for (int i = 0; i < static_cast<int>(per_unit_.size()); ++i) {
    if (!per_unit_[i].streamed) ZERO_RETURN_IF_ERROR(gradients_final(i));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> HostOffload::streamed_gradients(int i) const {
  const PerUnit& p = per_unit_[i];
  ZERO_RETURN_IF_ERROR(api_->synchronize(p.copied_out.get()));
  return Tensor(p.grads_out.data(), dtype_, {(*units_)[i].own_count});
}

absl::StatusOr<Tensor> HostOffload::parameters(int i) {
  if (params_on_host(i)) return (*units_)[i].own_params(dtype_);
  PerUnit& p = per_unit_[i];
  ZERO_RETURN_IF_ERROR(api_->synchronize(p.copied_in.get()));  // the last step's copy has read them
  return Tensor(p.params_in.data(), dtype_, {(*units_)[i].own_count});
}

absl::Status HostOffload::wait_for_shard_copies() {
  for (int i = 0; i < static_cast<int>(per_unit_.size()); ++i) {
    if (params_on_host(i)) return api_->synchronize(current_stream(device_));
  }
  return absl::OkStatus();
}

absl::Status HostOffload::send_parameters(int i) {
  if (params_on_host(i)) return absl::OkStatus();
  PerUnit& p = per_unit_[i];
  const Tensor params = (*units_)[i].own_params(dtype_);
  if (params.nbytes() == 0) return absl::OkStatus();
  // After what the current (compute) stream queued so far: its kernels and its waits for the gathers reading them.
  ZERO_RETURN_IF_ERROR(order_after(*api_, transfer_.get(), current_stream(device_), compute_marker_.get()));
  ZERO_RETURN_IF_ERROR(api_->copy_async(params.data(), p.params_in.data(), params.nbytes(), transfer_.get()));
  ZERO_RETURN_IF_ERROR(api_->record(p.copied_in.get(), transfer_.get()));
  return api_->wait(current_stream(device_), p.copied_in.get());  // the kernels read them after the copy
}

absl::Status HostOffload::release_gradients() {
  for (PerUnit& p : per_unit_) {
    if (p.streamed) ZERO_RETURN_IF_ERROR(api_->wait(current_stream(device_), p.copied_out.get()));
    p.streamed = false;
  }
  return absl::OkStatus();
}

}  // namespace zero
