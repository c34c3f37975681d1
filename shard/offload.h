// NVMe offload (ZeroConfig::offload_*_path): which states live in files, and moving them between files and RAM.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/allocator.h"
#include "runtime/cpu_stream.h"
#include "shard/config.h"
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

// How a file-backed buffer moves: one of Allocator::page_in, page_out and drop_unchanged.
using FileMove = absl::Status (Allocator::*)(const void* buffer_data);

// What of a unit is in files (params shard, master weights, optimizer state), moved by `move`; nothing for what is
// in RAM. Blocking: for the paths outside the update (initialization, checkpoints), which settle the
// OptimizerSwapper first.
absl::Status move_offloaded(const UnitState& u, Allocator& allocator, FileMove move);

// The units' optimizer tensors in files (master weights and optimizer state under offload_optimizer_path),
// moved by an I/O thread of their own in the update's order: each unit's read before its update (ahead of it
// under pipeline_read) and written after it (behind it under pipeline_write), with at most units_in_ram()
// units' in RAM at once. Owns those tensors' paging: every other path settle()s first. Calls come from one
// thread.
class OptimizerSwapper {
 public:
  // Fails, saying what to set, when buffer_count holds less than one unit's tensors (two units' with a
  // pipeline: one updating, one moving).
  static absl::StatusOr<std::unique_ptr<OptimizerSwapper>> create(std::span<const UnitState> units,
                                                                  Allocator& allocator,
                                                                  const ZeroConfig::OptimizerSwap& options);
  ~OptimizerSwapper();  // waits for what is queued, and logs a failure no call reported

  // Unit i's tensors in RAM, for its update: waits for their read (queued now unless read ahead), after queueing
  // reads of the units after it that fit (pipeline_read). A failure of unit i's transfers, this read's or an
  // earlier write's, is returned here, and the next acquire(i) reads again what did not arrive.
  absl::Status acquire(int i);
  // After unit i's update: queues the write of its tensors, and waits for it unless pipeline_write.
  absl::Status release(int i);
  // After the step's last update: queues reads of the first units that fit, for the next step (pipeline_read), and
  // returns the failures of the transfers done so far (waiting for none). A unit whose write failed keeps its
  // tensors in RAM, and its next write-out writes them again.
  absl::Status end_step();
  // Waits for everything queued; what was read ahead is dropped and what was acquired is written, so every
  // tensor is in its file. The first failure of a queued transfer not yet reported.
  absl::Status settle();

  int units_in_ram() const { return units_in_ram_; }

 private:
  enum class Held { kNo, kReadAhead, kAcquired };  // by the calling thread's queueing
  OptimizerSwapper(std::span<const UnitState> units, Allocator& allocator, const ZeroConfig::OptimizerSwap& options,
                   int units_in_ram);
  void queue(int i, FileMove move, Held then);
  void read_ahead_from(int first);
  void set_held(int i, Held held);
  // Unit i's failures so far, cleared; a failed unit is no longer held, so that it is read again.
  absl::Status take_failure(int i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status wait_for(int i);
  absl::Status take_failures();  // every unit's, without waiting

  const std::vector<std::string> names_;                 // [unit], for messages
  const std::vector<std::vector<const void*>> tensors_;  // [unit]: its file-backed optimizer tensors' data()
  Allocator& allocator_;
  const ZeroConfig::OptimizerSwap options_;
  const int units_in_ram_;
  std::vector<Held> held_;
  int held_count_ = 0;
  absl::Mutex mu_;
  std::vector<int> queued_ ABSL_GUARDED_BY(mu_);            // [unit]: transfers queued and not yet done
  std::vector<absl::Status> failure_ ABSL_GUARDED_BY(mu_);  // [unit]: the first failure not yet reported
  CpuStream io_{"zero-nvme-io"};                            // last: joined before the members its tasks use go
};

}  // namespace zero
