// The simulated device: CUDA's ordering rules on worker-thread streams over memory the host cannot read, with a
// happens-before checker that names any access or free not ordered after what it conflicts with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device_api.h"
#include "runtime/sim/order_checker.h"
#include "runtime/sim/sim_memory.h"

namespace zero::sim {

struct SimOptions {
  int devices = 8;
  // The happens-before checker: a call that queues an access or a free not ordered after a conflicting access
  // fails with FailedPrecondition naming both operations, and so does every later call (a free's caller, a
  // destructor, cannot return it). Off, the device only runs what it is given.
  bool check_order = true;
  // Each stream sleeps a random 0..max_delay_us before each operation (per-stream generator from `seed`), so
  // that an ordering the checker is not told about still shows in the values.
  int max_delay_us = 0;
  uint64_t seed = 0;
  size_t memory_bytes = size_t{64} << 30;  // address space shared by all devices; pages exist once touched
  size_t quarantine_bytes = size_t{64} << 20;
};

// Rules, as CUDA's (docs/architecture.md, "The simulated device"):
// - each stream runs its operations in order, on a thread of its own;
// - the legacy default stream (id 0) waits for work queued before on the device's blocking streams, and
//   blocking streams' later work waits for it; non-blocking streams are ordered by events only;
// - wait(stream, event) orders after the event's latest record as of the call; copy() waits for the legacy
//   stream only; a host synchronization orders the host thread after what it waited for, and so does a copy()
//   to host memory or from pinned memory (cudaMemcpy may return before one from pageable or device memory
//   reached the device);
// - each host thread has a current device; a launch's stream must be on it, its pointers on the stream's device;
// - frees take effect when the stream reaches them; the block is then poisoned with NaN and quarantined.
// Thread-safe. Destruction runs what was queued, joins the streams' threads and frees the pinned memory left.
class SimDevice final : public DeviceApi {
 public:
  static absl::StatusOr<std::unique_ptr<SimDevice>> create(SimOptions options = {});
  ~SimDevice() override;

  DeviceType type() const override { return DeviceType::kSim; }
  int device_count() const override { return options_.devices; }
  absl::Status set_current_device(int device) override;
  int current_device() const override;
  absl::StatusOr<Stream> create_stream(int device, StreamFlags flags) override;
  absl::Status destroy_stream(Stream stream) override;
  absl::StatusOr<Event> create_event(int device) override;
  absl::Status destroy_event(Event event) override;
  absl::Status record(Event event, Stream stream) override;
  absl::Status wait(Stream stream, Event event) override;
  absl::StatusOr<bool> query(Event event) override;
  absl::Status synchronize(Event event) override;
  absl::Status synchronize(Stream stream) override;
  absl::Status synchronize_device(int device) override;
  absl::StatusOr<void*> allocate(size_t bytes, Stream stream) override;
  absl::Status free(void* ptr, Stream stream) override;
  absl::StatusOr<void*> allocate_pinned(size_t bytes) override;
  absl::Status free_pinned(void* ptr) override;
  absl::Status copy_async(void* dst, const void* src, size_t bytes, Stream stream) override;
  absl::Status copy(void* dst, const void* src, size_t bytes) override;
  absl::Status launch(Stream stream, KernelLaunch launch) override;

  // How many calls of the calling host thread so far blocked it until device work finished: synchronize (an event,
  // a stream, a device) and copy() with device memory on a side. Each stalls a GPU's host thread; the count per
  // step shows what an engine still waits for.
  uint64_t host_synchronizations();

 private:
  struct Op;
  struct StreamState;
  struct EventState {
    int device = 0;
    std::shared_ptr<Op> latest;  // the latest record; null before the first
  };
  struct HostThread {
    Agent agent = 0;
    VectorClock clock;
    int device = 0;
    uint64_t synchronizations = 0;
  };
  // Where a copy's side lives: device memory (a live block) or pinned host memory.
  struct Side {
    bool on_device = false;
    uintptr_t block = 0;  // the block or the pinned allocation holding it
    int device = 0;
  };

  SimDevice(SimOptions options, SimMemory memory);

  HostThread& host_thread() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<StreamState*> stream_state(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<EventState*> event_state(Event event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  StreamState& legacy_stream(int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status check_device(int device) const;
  // Queues `run` on `stream` after what CUDA orders before it, checking `accesses` (block, range, write).
  struct Touch {
    uintptr_t block = 0;
    uintptr_t begin = 0;
    uintptr_t end = 0;
    bool write = false;
  };
  absl::StatusOr<std::shared_ptr<Op>> enqueue(StreamState& stream, std::string name, const std::vector<Touch>& touches,
                                              std::function<absl::Status()> run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Side> side_of(const void* ptr, size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<Op>> enqueue_copy(StreamState& stream, void* dst, const void* src, size_t bytes,
                                                   bool host_side_pageable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Blocks until `op` ran, then orders the calling host thread after it unless `order_host` is false. By value:
  // the stream's tail or the event's record it was read from may change, or move, while the lock is released.
  absl::Status wait_for(std::shared_ptr<Op> op, bool order_host = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status violation(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void start_worker(StreamState& stream);
  void run_stream(StreamState* stream);

  const SimOptions options_;
  const uintptr_t alias_shift_;  // SimMemory::alias_shift, read by launch bodies without the lock
  mutable absl::Mutex mu_;
  SimMemory memory_ ABSL_GUARDED_BY(mu_);
  AccessHistory history_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // the first failed operation's, sticky
  Agent next_agent_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, HostThread> hosts_ ABSL_GUARDED_BY(mu_);                      // by this_thread_serial()
  absl::flat_hash_map<uint64_t, std::unique_ptr<StreamState>> streams_ ABSL_GUARDED_BY(mu_);  // by id
  std::vector<std::unique_ptr<StreamState>> destroyed_ ABSL_GUARDED_BY(mu_);  // joined once ended, or at destruction
  absl::flat_hash_map<int, uint64_t> legacy_ids_ ABSL_GUARDED_BY(mu_);        // device -> its legacy stream
  absl::flat_hash_map<uint64_t, EventState> events_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uintptr_t, size_t> pinned_ ABSL_GUARDED_BY(mu_);  // base -> bytes
  std::vector<void*> unordered_pinned_frees_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zero::sim
