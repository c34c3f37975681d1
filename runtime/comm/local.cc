#include "runtime/comm/local.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/comm/post_events.h"
#include "runtime/comm/reduce.h"
#include "runtime/status.h"

namespace zero {

namespace {

const char* at_bytes(const void* base, int64_t offset) { return static_cast<const char*>(base) + offset; }
char* at_bytes(void* base, int64_t offset) { return static_cast<char*>(base) + offset; }

class LocalBackend final : public Backend {
 public:
  LocalBackend(LocalGroup* group, int rank) : group_(group), rank_(rank) {}

  absl::string_view name() const override { return "local"; }
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }
  bool supports(Device device) const override {
#ifdef ZERO_HAS_CUDA
    return device.is_cpu() || device.is_sim() || device.is_cuda();
#else
    return device.is_cpu() || device.is_sim();
#endif
  }

  // Device buffers are read and written on the device's legacy stream, which every rank's comm thread makes wait
  // for its own post before they meet: so every rank's part runs after every rank's inputs were written.
  absl::Status prepare(const Collective& c) override { return posted_.record(c); }

  absl::Status run(const Collective& c, absl::Time deadline) override {
    // The reductions and copies below go to the current stream: the one the post wait and the completion event use.
    const StreamScope on_stream(c.device, c.device.is_cpu() ? std::nullopt : std::optional<Stream>(stream_for(c)));
    ZERO_RETURN_IF_ERROR(posted_.wait(stream_for(c), c));
    ZERO_RETURN_IF_ERROR(group_->post_and_meet(rank_, c, deadline));
    std::vector<CollectiveFingerprint> fingerprints;
    for (int r = 0; r < world_size(); ++r) fingerprints.push_back(CollectiveFingerprint::of(group_->posted(r)));
    ZERO_RETURN_IF_ERROR(check_fingerprints_agree(fingerprints));
    ZERO_RETURN_IF_ERROR(check_same_device(c));
    ZERO_RETURN_IF_ERROR(compute_my_part(c, deadline));
    // Nobody posts its next collective over a slot, or reuses a buffer, that a peer may still read.
    return group_->meet(rank_, c, deadline);
  }

  void abort(const absl::Status& cause) override { group_->abort(rank_, cause); }

 private:
  // Every rank reads its peers' buffers directly, which works where they all are in one memory: the host,
  // or one GPU. Every rank sees a mismatch, so every rank fails.
  absl::Status check_same_device(const Collective& c) const {
    for (int r = 0; r < world_size(); ++r) {
      const Device theirs = group_->posted(r).device;
      if (theirs == c.device) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("local backend, ", c.describe(), ": rank ", rank_, "'s buffers are on ", c.device.to_string(),
                       ", rank ", r, "'s on ", theirs.to_string(),
                       "; local ranks read one another's buffers, so all must be on the host or "
                       "all on one GPU (use nccl for one process per GPU)"));
    }
    return absl::OkStatus();
  }

  absl::Status compute_my_part(const Collective& c, absl::Time deadline) {
    const int n = world_size();
    const int64_t esize = static_cast<int64_t>(dtype_size(c.dtype));
    const int64_t chunk = c.chunk_bytes();
    const auto peer = [&](int r) -> const Collective& { return group_->posted(r); };
    std::vector<const void*> inputs(n);
    switch (c.op) {
      case CollectiveOp::kAllreduce: {
        const auto [begin, end] = chunk_range(c.count, rank_, n);
        for (int r = 0; r < n; ++r) inputs[r] = at_bytes(peer(r).recv, begin * esize);
        ZERO_RETURN_IF_ERROR(
            reduce_in_rank_order(c.device, inputs, at_bytes(c.recv, begin * esize), end - begin, c.dtype, c.reduce_op));
        ZERO_RETURN_IF_ERROR(group_->meet(rank_, c, deadline));  // every chunk is reduced in its owner's buffer
        for (int r = 0; r < n; ++r) {
          if (r == rank_) continue;
          const auto [b, e] = chunk_range(c.count, r, n);
          ZERO_RETURN_IF_ERROR(queue_copy_bytes(c.device, at_bytes(c.recv, b * esize),
                                                at_bytes(peer(r).recv, b * esize), (e - b) * esize));
        }
        return absl::OkStatus();
      }
      case CollectiveOp::kReduceScatter:
        for (int r = 0; r < n; ++r) inputs[r] = at_bytes(peer(r).send, rank_ * chunk);
        return reduce_in_rank_order(c.device, inputs, c.recv, c.count, c.dtype, c.reduce_op);
      case CollectiveOp::kReduce:
        if (rank_ != c.root) return absl::OkStatus();
        for (int r = 0; r < n; ++r) inputs[r] = peer(r).recv;
        return reduce_in_rank_order(c.device, inputs, c.recv, c.count, c.dtype, c.reduce_op);
      case CollectiveOp::kAllgather:
        for (int r = 0; r < n; ++r) {
          ZERO_RETURN_IF_ERROR(queue_copy_bytes(c.device, at_bytes(c.recv, r * chunk), peer(r).send, chunk));
        }
        return absl::OkStatus();
      case CollectiveOp::kGather:
        if (rank_ != c.root) return absl::OkStatus();
        for (int r = 0; r < n; ++r) {
          ZERO_RETURN_IF_ERROR(queue_copy_bytes(c.device, at_bytes(c.recv, r * chunk), peer(r).send, chunk));
        }
        return absl::OkStatus();
      case CollectiveOp::kBroadcast:
        return rank_ == c.root ? absl::OkStatus() : queue_copy_bytes(c.device, c.recv, peer(c.root).recv, chunk);
      case CollectiveOp::kScatter:
        return queue_copy_bytes(c.device, c.recv, at_bytes(peer(c.root).send, rank_ * chunk), chunk);
      case CollectiveOp::kBarrier: return absl::OkStatus();
    }
    return absl::InternalError("unknown collective");
  }

  LocalGroup* const group_;
  const int rank_;
  PostEvents posted_;
};

}  // namespace

LocalGroup::LocalGroup(int world_size)
    : world_size_(world_size), posted_(world_size), arrived_at_(world_size, ~uint64_t{0}), exited_(world_size, false) {
  ZERO_CHECK(world_size >= 1, "a group needs at least one rank, got ", world_size);
}

std::unique_ptr<Communicator> LocalGroup::communicator(int rank, CommOptions options) {
  ZERO_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " outside a group of ", world_size_);
  return std::make_unique<Communicator>(std::make_unique<LocalBackend>(this, rank), options);
}

void LocalGroup::rank_exited(int rank, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  exited_[rank] = true;
  if (!status.ok() && failure_.ok()) {
    failure_ = absl::AbortedError(absl::StrCat("rank ", rank, " failed: ", status.message()));
  }
}

void LocalGroup::abort(int rank, const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  if (!failure_.ok()) return;
  failure_ = absl::AbortedError(absl::StrCat("rank ", rank, " failed: ", cause.message()));
}

absl::Status LocalGroup::failure_for(int rank, const Collective& c) const {
  return absl::AbortedError(absl::StrCat("rank ", rank, " gave up on ", c.describe(), ": ", failure_.message()));
}

absl::Status LocalGroup::post_and_meet(int rank, const Collective& c, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    posted_[rank] = c;
  }
  return meet(rank, c, deadline);
}

std::vector<int> LocalGroup::missing_from(uint64_t generation) const {
  std::vector<int> ranks;
  for (int r = 0; r < world_size_; ++r) {
    if (arrived_at_[r] != generation) ranks.push_back(r);
  }
  return ranks;
}

bool LocalGroup::meeting_settled(uint64_t generation) const {
  if (generation_ != generation || !failure_.ok()) return true;
  for (int r = 0; r < world_size_; ++r) {
    if (arrived_at_[r] != generation && exited_[r]) return true;
  }
  return false;
}

absl::Status LocalGroup::meet(int rank, const Collective& c, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (!failure_.ok()) return failure_for(rank, c);
  const uint64_t generation = generation_;
  arrived_at_[rank] = generation;
  if (++arrived_ == world_size_) {
    arrived_ = 0;
    ++generation_;
    return absl::OkStatus();
  }
  // Every change to the group is made under mu_, and Await re-checks the condition after each.
  const auto settled = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return meeting_settled(generation); };
  mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
  if (generation_ != generation) return absl::OkStatus();
  if (!failure_.ok()) return failure_for(rank, c);
  const std::vector<int> missing = missing_from(generation);
  for (int r : missing) {
    if (exited_[r]) {
      failure_ = absl::AbortedError(absl::StrCat("rank ", r, " finished its work without joining ", c.describe()));
      return failure_for(rank, c);
    }
  }
  // Not settled, so the deadline passed.
  failure_ = absl::DeadlineExceededError(
      absl::StrCat("timed out in ", c.describe(), " waiting for ", missing.size() == 1 ? "rank " : "ranks ",
                   absl::StrJoin(missing, ", "), "; a rank stopped answering or issued fewer collectives"));
  return failure_;
}

std::vector<absl::Status> run_local_ranks(int world_size, const std::function<absl::Status(Communicator&)>& fn,
                                          CommOptions options) {
  if (world_size < 1) {
    return {absl::InvalidArgumentError(absl::StrCat("local ranks: at least one rank is needed, got ", world_size))};
  }
  LocalGroup group(world_size);
  std::vector<absl::Status> statuses(world_size);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      absl::Status status;
      {
        std::unique_ptr<Communicator> comm = group.communicator(r, options);
        status = run_rank(fn, *comm, world_size);
        if (!status.ok()) group.rank_exited(r, status);  // before draining: peers must not wait on us
      }
      group.rank_exited(r, status);
      statuses[r] = std::move(status);
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

absl::Status root_cause(const std::vector<absl::Status>& statuses) {
  for (const absl::Status& s : statuses) {
    if (!s.ok() && !absl::IsAborted(s)) return s;
  }
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace zero
