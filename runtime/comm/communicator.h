// One rank's view of a process group: async collectives with Work handles, timeouts and byte counters.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/comm/backend.h"
#include "runtime/comm/collective.h"
#include "runtime/comm/work.h"
#include "runtime/cpu_stream.h"
#include "runtime/tensor.h"

namespace zero {

class Allocator;

// The first failure among ranks that one process drives, each with a communicator of its own
// (run_nccl_ranks_in_process): a rank reports its failure when it aborts or ends, and every rank's
// waits poll it, so peers fail at once instead of at their deadline. Thread-safe.
class SharedFailure {
 public:
  void report(int rank, const absl::Status& cause);  // keeps the first, as Aborted naming the rank
  absl::Status first() const;                        // OK until a rank reported

 private:
  mutable absl::Mutex mu_;
  absl::Status first_ ABSL_GUARDED_BY(mu_);
};

struct CommOptions {
  // A collective that has not finished by then fails on this rank, and so on every rank.
  absl::Duration timeout = absl::Seconds(300);
  // Before each collective, check that every rank issues the same one (sequence, op, dtype, count, root) and
  // name the ranks that diverge. Unset: on for mpi, where a mismatched collective would corrupt memory
  // rather than fail (one small allgather per collective), off for local (which compares what every rank
  // posts anyway) and nccl (where the check costs a device round trip per collective).
  std::optional<bool> debug_collectives;
  // Accounts the backend's scratch memory under MemoryCategory::kCommBuffers (and its budget); must outlive
  // the communicator. Null: the backend uses a private allocator, so the scratch counts against no budget.
  Allocator* allocator = nullptr;
  // Shared by the ranks one process drives (nccl); null for ranks in processes of their own.
  std::shared_ptr<SharedFailure> shared_failure;

  // Defaults, overridden by ZERO_COMM_TIMEOUT_S (seconds: a finite number > 0, at most 10^6) and
  // ZERO_DEBUG_COLLECTIVES (1 on, 0 off for every backend); InvalidArgument naming the variable otherwise.
  static absl::StatusOr<CommOptions> parse_env();
  // The same, with the defaults kept where a variable is malformed: programs check parse_env() first.
  static CommOptions from_env();
};

struct OpCounters {
  int64_t calls = 0;
  int64_t payload_bytes = 0;  // see payload_bytes() in collective.h
  int64_t sent_bytes = 0;     // see bytes_sent() in collective.h
};

struct CommStats {
  std::array<OpCounters, kNumCollectiveOps> per_op{};

  const OpCounters& of(CollectiveOp op) const { return per_op[static_cast<int>(op)]; }
  int64_t total_sent_bytes() const;
};

// All calls return at once; the work runs in order on this rank's communication thread. Every rank must
// issue the same collectives in the same order. After the first failure every later call fails with it.
// Tensors must be contiguous and on a device the backend supports; input and output share a dtype.
// reduce_scatter and allgather move equal chunks: padding a buffer to a multiple of the world size is
// the caller's job (the engine pads its flat units).
//
// Collectives: allreduce through barrier, and agree_across_ranks below: every rank makes each call, in the
// same order. The accessors, stats() and reset_stats() are local to the rank.
// Threads: every call is safe from several threads at once (not alongside the destructor), but as the
// order must match across ranks, a rank issues its collectives from one thread or orders its threads itself.
// Device collectives: a Work completes once its collective is queued on the device, and Work::wait orders the
// waiter's current stream after it; the backend then settles it on the watchdog thread (Backend::settle) while the
// comm thread runs the next; a failure found there aborts the backend (ending what it still has queued) and fails
// the collectives the comm thread starts after.
// Lifetimes: a host collective's buffers must stay valid until its Work finished; a device collective's until work
// queued after its Work::wait on the waiter's stream (a free there is ordered after it), or a device
// synchronization. CommOptions::allocator (and a local communicator's LocalGroup) must outlive the communicator;
// its Work handles may outlive it.
class Communicator {
 public:
  Communicator(std::unique_ptr<Backend> backend, CommOptions options);
  ~Communicator();  // runs (device collectives: queues and settles) pending work first
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  absl::string_view backend_name() const { return backend_->name(); }
  Device home_device() const { return backend_->home_device(); }  // see Backend::home_device
  const CommOptions& options() const { return options_; }

  Work allreduce(Tensor buffer, ReduceOp op);                     // buffer (n), in place
  Work reduce_scatter(Tensor input, Tensor output, ReduceOp op);  // input (N*n) -> output (n)
  Work allgather(Tensor input, Tensor output);                    // input (n) -> output (N*n)
  Work broadcast(Tensor buffer, int root);                        // buffer (n)
  Work reduce(Tensor buffer, int root, ReduceOp op);              // buffer (n), result on root
  Work gather(Tensor input, Tensor output, int root);             // input (n) -> output (N*n) on root
  Work scatter(Tensor input, Tensor output, int root);            // input (N*n) on root -> output (n)
  Work barrier();

  CommStats stats() const;
  void reset_stats();

  // Waits until every collective posted so far has run and been settled (Backend::settle), and returns the
  // communicator's failure: how a rank learns that a device collective failed after its Work completed, where no
  // later collective would tell it (run_rank calls it when the rank's work returns OK; an export before it hands
  // out gathered data). Not a collective.
  absl::Status flush();

 private:
  absl::Status validate(CollectiveOp op, const Tensor* input, const Tensor* output, int root,
                        std::optional<ReduceOp> reduce_op) const;
  Work submit(Collective c) ABSL_LOCKS_EXCLUDED(post_mu_, mu_);
  // Runs `c` on the comm thread and completes `state`: a device collective once queued on the device (with its
  // completion event), and hands it to the watchdog to settle.
  void execute(const Collective& c, WorkState& state) ABSL_LOCKS_EXCLUDED(mu_);
  // An event recorded after `c`'s device work, for its Work's waiters' streams.
  absl::StatusOr<std::shared_ptr<const DeviceCompletion>> mark_end_on_device(const Collective& c);
  // Makes `status` the sticky failure and aborts the backend.
  absl::Status fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status check_same_collective(const Collective& c, absl::Time deadline);

  const std::unique_ptr<Backend> backend_;
  const CommOptions options_;
  const int rank_;
  const int world_size_;

  // Held across submit, so collectives are numbered, prepared (Backend::prepare) and queued in one order.
  absl::Mutex post_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  CommStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // the first failure; sticky

  // Settles the device collectives the comm thread queued (Backend::settle), in order, while it runs the next: so
  // several are queued on the device at once, and a stalled one still fails within its deadline (c10d's watchdog).
  CpuStream watchdog_;
  CpuStream stream_;  // the comm thread; last: destroyed (drained, handing the watchdog its last tasks) first
};

// fn(comm) on the calling rank thread, given its share of the cores with `ranks_sharing` ranks on them
// (runtime/cpu_threads.h), an exception turned into an InternalError naming the rank, and an OK turned into the
// communicator's failure if it has one (flush): how a rank's thread ends.
absl::Status run_rank(const std::function<absl::Status(Communicator&)>& fn, Communicator& comm, int ranks_sharing);

// Every rank passes how its part of a joint task (`task`, e.g. "writing checkpoint ckpt/step-100") went;
// every rank gets OK only when all parts did. A failed rank gets its own error back, the others one
// naming the failed ranks, so no rank goes on alone. A collective: every rank must call it.
absl::Status agree_across_ranks(Communicator& comm, const absl::Status& mine, absl::string_view task);

// The ranks whose `fingerprint` (a hash of what every rank must hold alike: a model's layout, the
// checkpoint it read) differs from rank 0's, in order; empty when all agree. A collective.
absl::StatusOr<std::vector<int>> ranks_unlike_rank_0(Communicator& comm, uint64_t fingerprint);

}  // namespace zero
