// A loader's host micro-batch copied onto the device the model trains on, into buffers allocated once.
#pragma once

#include "absl/status/statusor.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "shard/module.h"

namespace zero::data {

// The DataLoader fills its batch on the host; units read theirs on UnitContext::device. On the CPU,
// place() returns the host batch itself; on a GPU it uploads inputs and targets into one kActivations
// buffer there (allocated at the first call, reused after: every batch of a loader has one shape) through
// pinned_uploads, so the host does not wait, and keeps the host batch as Batch::host_inputs and host_targets
// (valid while the host batch is).
class DeviceBatch {
 public:
  DeviceBatch(Allocator& allocator, Device device) : allocator_(allocator), device_(device) {}
  absl::StatusOr<Batch> place(const Batch& host);

 private:
  Allocator& allocator_;
  Device device_;
  Buffer buffer_;  // inputs, then targets
};

}  // namespace zero::data
