// DeviceBatch: one buffer on the device, refilled from each host batch with two uploads that do not wait.
#include "models/data/device_batch.h"

#include "runtime/pinned_uploads.h"
#include "runtime/status.h"

namespace zero::data {
namespace {

// `host`'s layout over `data` on `device`, and its bytes queued for there on the calling thread's current stream
// (an engine orders its compute stream after it, and the caller's stream after the kernels that read the batch).
absl::StatusOr<Tensor> copy_to(void* data, Device device, const Tensor& host) {
  ZERO_RETURN_IF_ERROR(pinned_uploads(device)->upload(data, host.data(), host.nbytes(), current_stream(device)));
  return Tensor(data, host.dtype(), host.shape(), host.strides(), device);
}

}  // namespace

absl::StatusOr<Batch> DeviceBatch::place(const Batch& host) {
  if (device_.is_cpu()) return host;
  const int64_t bytes = static_cast<int64_t>(host.inputs.nbytes() + host.targets.nbytes());
  if (buffer_.data() == nullptr) {
    ZERO_ASSIGN_OR_RETURN(buffer_, allocator_.allocate(bytes, MemoryCategory::kActivations, device_));
  }
  ZERO_CHECK(buffer_.nbytes() == bytes, "every batch of a loader has one shape");
  char* base = static_cast<char*>(buffer_.data());
  Batch batch;
  ZERO_ASSIGN_OR_RETURN(batch.inputs, copy_to(base, device_, host.inputs));
  ZERO_ASSIGN_OR_RETURN(batch.targets, copy_to(base + host.inputs.nbytes(), device_, host.targets));
  batch.host_inputs = host.inputs;
  batch.host_targets = host.targets;
  return batch;
}

}  // namespace zero::data
