// Uploads from pageable host memory that do not stall the host: staged through page-locked blocks reused once the
// copy out of them has finished, as PyTorch's CachingHostAllocator does.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device.h"
#include "runtime/device_api.h"

namespace zero {

// A copy from pageable host memory to a device (cudaMemcpy) waits for the device's queued work; an asynchronous
// copy needs page-locked memory. upload() copies the bytes into a pinned block, queues the block's copy on the
// stream and records an event after it, then returns: the source is free again, and the host waited for nothing.
// A block is reused once its event completed (a query), so blocks grow in number only while copies are in flight.
// For small, frequent uploads, such as a micro-batch. Thread-safe.
class PinnedUploads {
 public:
  explicit PinnedUploads(DeviceApi& api) : api_(api) {}
  PinnedUploads(const PinnedUploads&) = delete;
  PinnedUploads& operator=(const PinnedUploads&) = delete;

  // Queues the copy of `bytes` at host `src` to device memory `dst` on `stream`.
  absl::Status upload(void* dst, const void* src, size_t bytes, Stream stream);
  // How many blocks exist: at most the uploads in flight at once.
  size_t blocks() const;

 private:
  struct Block {
    int device = 0;
    PinnedBuffer memory;
    OwnedEvent copied;  // recorded after the last copy out of `memory`
  };
  // A block of `device` whose last copy finished and that holds `bytes`, grown or made as needed.
  absl::StatusOr<Block*> free_block(int device, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  DeviceApi& api_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Block>> blocks_ ABSL_GUARDED_BY(mu_);
};

// The process-wide uploads to `device` (never destroyed, as the device APIs); null for the CPU.
PinnedUploads* pinned_uploads(Device device);

}  // namespace zero
