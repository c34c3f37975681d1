// The `local` backend: N ranks as threads of one process sharing memory, reducing in fixed rank order.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/comm/collective.h"
#include "runtime/comm/communicator.h"

namespace zero {

// Shared by the ranks of one in-process group. Each collective is three steps: every rank posts its
// buffers and meets the others; each rank computes its own part reading the peers' buffers directly
// (rank r reduces element chunk r in order 0..N-1, so allreduce equals reduce_scatter + allgather bit
// for bit); everyone meets again before anyone returns. Mismatched collectives are always caught here.
// Thread-safe: each rank's thread (and its communicator's) calls in concurrently. It must outlive the
// communicators it made.
class LocalGroup {
 public:
  explicit LocalGroup(int world_size);

  int world_size() const { return world_size_; }
  // Rank `rank`'s communicator. The group must outlive it.
  std::unique_ptr<Communicator> communicator(int rank, CommOptions options = CommOptions::from_env());

  // A rank's work ended. Peers waiting for it in a collective fail at once instead of hanging; if it
  // failed, every pending and later collective of the group fails with its reason.
  void rank_exited(int rank, const absl::Status& status);
  void abort(int rank, const absl::Status& cause);

  // Backend plumbing: post `c` as rank `rank`'s and wait for all ranks (a full barrier).
  absl::Status post_and_meet(int rank, const Collective& c, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status meet(int rank, const Collective& c, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Rank `rank`'s posted collective, read without the lock: only between post_and_meet and the next meet,
  // when every rank has posted and none posts again until all have met.
  const Collective& posted(int rank) const ABSL_NO_THREAD_SAFETY_ANALYSIS { return posted_[rank]; }

 private:
  absl::Status failure_for(int rank, const Collective& c) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the wait of the ranks that arrived at `generation` is over: everyone came, the group failed,
  // or a rank that has not come exited.
  bool meeting_settled(uint64_t generation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<int> missing_from(uint64_t generation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int world_size_;
  absl::Mutex mu_;
  std::vector<Collective> posted_ ABSL_GUARDED_BY(mu_);  // written under mu_; see posted()
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> arrived_at_ ABSL_GUARDED_BY(mu_);  // per rank, the generation of its last arrival
  std::vector<bool> exited_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // first failure in the group
};

// Runs fn on `world_size` threads, each with its rank's communicator, and returns each rank's status.
// A rank that returns an error or throws makes the others' collectives fail instead of hanging.
// Fewer than one rank runs nothing and returns one InvalidArgument status.
std::vector<absl::Status> run_local_ranks(int world_size, const std::function<absl::Status(Communicator&)>& fn,
                                          CommOptions options = CommOptions::from_env());

// The status that explains a run: the first error that is not a consequence of another rank's failure.
absl::Status root_cause(const std::vector<absl::Status>& statuses);

}  // namespace zero
