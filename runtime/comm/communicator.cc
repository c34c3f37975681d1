#include "runtime/comm/communicator.h"

#include <cstdlib>
#include <exception>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/cpu_threads.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

namespace zero {

absl::StatusOr<CommOptions> CommOptions::parse_env() {
  CommOptions options;
  if (const char* s = std::getenv("ZERO_COMM_TIMEOUT_S")) {
    double seconds = 0;
    if (!absl::SimpleAtod(s, &seconds) || !(seconds > 0 && seconds <= 1e6)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ZERO_COMM_TIMEOUT_S = '", s, "': the collective deadline is a number of seconds in (0, 1e6]"));
    }
    options.timeout = absl::Seconds(seconds);
  }
  if (const char* s = std::getenv("ZERO_DEBUG_COLLECTIVES")) {
    const absl::string_view value(s);
    if (value != "0" && value != "1") {
      return absl::InvalidArgumentError(absl::StrCat("ZERO_DEBUG_COLLECTIVES = '", s, "': use 0 or 1"));
    }
    options.debug_collectives = value == "1";
  }
  return options;
}

CommOptions CommOptions::from_env() {
  absl::StatusOr<CommOptions> options = parse_env();
  return options.ok() ? *std::move(options) : CommOptions();
}

void SharedFailure::report(int rank, const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  if (first_.ok()) first_ = absl::AbortedError(absl::StrCat("rank ", rank, " failed: ", cause.message()));
}

absl::Status SharedFailure::first() const {
  absl::MutexLock lock(&mu_);
  return first_;
}

int64_t CommStats::total_sent_bytes() const {
  int64_t total = 0;
  for (const OpCounters& c : per_op) total += c.sent_bytes;
  return total;
}

absl::Status Backend::exchange_fingerprints(const CollectiveFingerprint& mine, std::span<CollectiveFingerprint> all,
                                            absl::Time deadline) {
  Collective c{.op = CollectiveOp::kAllgather,
               .dtype = DType::kU8,
               .count = sizeof(CollectiveFingerprint),
               .send = &mine,
               .recv = all.data()};
  return run(c, deadline);
}

Communicator::Communicator(std::unique_ptr<Backend> backend, CommOptions options)
    : backend_(std::move(backend)), options_(options), rank_(backend_->rank()), world_size_(backend_->world_size()),
      watchdog_(absl::StrCat("zero-watch-", backend_->rank())), stream_(absl::StrCat("zero-comm-", backend_->rank())) {}

Communicator::~Communicator() { (void)flush(); }

Work Communicator::allreduce(Tensor buffer, ReduceOp op) {
  if (absl::Status s = validate(CollectiveOp::kAllreduce, nullptr, &buffer, 0, op); !s.ok()) return Work::completed(s);
  return submit({.op = CollectiveOp::kAllreduce,
                 .reduce_op = op,
                 .dtype = buffer.dtype(),
                 .device = buffer.device(),
                 .count = buffer.numel(),
                 .send = buffer.data(),
                 .recv = buffer.data()});
}

Work Communicator::reduce_scatter(Tensor input, Tensor output, ReduceOp op) {
  if (absl::Status s = validate(CollectiveOp::kReduceScatter, &input, &output, 0, op); !s.ok()) {
    return Work::completed(s);
  }
  return submit({.op = CollectiveOp::kReduceScatter,
                 .reduce_op = op,
                 .dtype = output.dtype(),
                 .device = output.device(),
                 .count = output.numel(),
                 .send = input.data(),
                 .recv = output.data()});
}

Work Communicator::allgather(Tensor input, Tensor output) {
  if (absl::Status s = validate(CollectiveOp::kAllgather, &input, &output, 0, std::nullopt); !s.ok()) {
    return Work::completed(s);
  }
  return submit({.op = CollectiveOp::kAllgather,
                 .dtype = input.dtype(),
                 .device = input.device(),
                 .count = input.numel(),
                 .send = input.data(),
                 .recv = output.data()});
}

Work Communicator::broadcast(Tensor buffer, int root) {
  if (absl::Status s = validate(CollectiveOp::kBroadcast, nullptr, &buffer, root, std::nullopt); !s.ok()) {
    return Work::completed(s);
  }
  return submit({.op = CollectiveOp::kBroadcast,
                 .dtype = buffer.dtype(),
                 .device = buffer.device(),
                 .count = buffer.numel(),
                 .send = buffer.data(),
                 .recv = buffer.data(),
                 .root = root});
}

Work Communicator::reduce(Tensor buffer, int root, ReduceOp op) {
  if (absl::Status s = validate(CollectiveOp::kReduce, nullptr, &buffer, root, op); !s.ok()) return Work::completed(s);
  return submit({.op = CollectiveOp::kReduce,
                 .reduce_op = op,
                 .dtype = buffer.dtype(),
                 .device = buffer.device(),
                 .count = buffer.numel(),
                 .send = buffer.data(),
                 .recv = buffer.data(),
                 .root = root});
}

Work Communicator::gather(Tensor input, Tensor output, int root) {
  const bool is_root = rank_ == root;
  if (absl::Status s = validate(CollectiveOp::kGather, &input, is_root ? &output : nullptr, root, std::nullopt);
      !s.ok()) {
    return Work::completed(s);
  }
  return submit({.op = CollectiveOp::kGather,
                 .dtype = input.dtype(),
                 .device = input.device(),
                 .count = input.numel(),
                 .send = input.data(),
                 .recv = is_root ? output.data() : nullptr,
                 .root = root});
}

Work Communicator::scatter(Tensor input, Tensor output, int root) {
  const bool is_root = rank_ == root;
  if (absl::Status s = validate(CollectiveOp::kScatter, is_root ? &input : nullptr, &output, root, std::nullopt);
      !s.ok()) {
    return Work::completed(s);
  }
  return submit({.op = CollectiveOp::kScatter,
                 .dtype = output.dtype(),
                 .device = output.device(),
                 .count = output.numel(),
                 .send = is_root ? input.data() : nullptr,
                 .recv = output.data(),
                 .root = root});
}

Work Communicator::barrier() { return submit({.op = CollectiveOp::kBarrier}); }

CommStats Communicator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Communicator::reset_stats() {
  absl::MutexLock lock(&mu_);
  stats_ = CommStats{};
}

absl::Status Communicator::validate(CollectiveOp op, const Tensor* input, const Tensor* output, int root,
                                    std::optional<ReduceOp> reduce_op) const {
  const absl::string_view name = collective_op_name(op);
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": root ", root, " is not a rank of a world of ", world_size_));
  }
  const Tensor* first = input != nullptr ? input : output;
  for (const Tensor* t : {input, output}) {
    if (t == nullptr) continue;
    if (!t->is_contiguous())
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", t->to_string(), " is not contiguous"));
    if (t->dtype() != first->dtype() || t->device() != first->device()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": input ", first->to_string(), " and output ",
                                                     t->to_string(), " differ in dtype or device"));
    }
    if (!backend_->supports(t->device())) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": the ", backend_->name(), " backend cannot reach ", t->device().to_string(), " memory"));
    }
  }
  if (reduce_op) {
    const DType t = first->dtype();
    if (!is_floating(t) && t != DType::kI32) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": cannot reduce ", dtype_name(t), "; reductions take fp32, bf16, fp16 or int32"));
    }
    if (t == DType::kI32 && *reduce_op == ReduceOp::kAvg) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": avg of int32 is not defined; use sum and divide"));
    }
  }
  const auto require_multiple = [&](const Tensor& whole, const Tensor& chunk) -> absl::Status {
    if (whole.numel() == world_size_ * chunk.numel()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": the whole buffer has ", whole.numel(), " elements but must hold world size ", world_size_,
                     " x ", chunk.numel(), " (one chunk per rank); pad it to a multiple of the world size"));
  };
  switch (op) {
    case CollectiveOp::kReduceScatter: return require_multiple(*input, *output);
    case CollectiveOp::kAllgather: return require_multiple(*output, *input);
    case CollectiveOp::kGather: return output != nullptr ? require_multiple(*output, *input) : absl::OkStatus();
    case CollectiveOp::kScatter: return input != nullptr ? require_multiple(*input, *output) : absl::OkStatus();
    default: return absl::OkStatus();
  }
}

Work Communicator::submit(Collective c) {
  auto state = std::make_shared<WorkState>();
  absl::MutexLock post(&post_mu_);  // numbered, prepared and queued in one order
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return Work::completed(failure_);
    c.seq = next_seq_++;
    OpCounters& counters = stats_.per_op[static_cast<int>(c.op)];
    counters.calls += 1;
    counters.payload_bytes += payload_bytes(c, world_size_);
    counters.sent_bytes += bytes_sent(c, rank_, world_size_);
  }
  // Prepared here, on the posting thread; failing, it fails in its turn on the comm thread like a run.
  const absl::Status prepared = backend_->prepare(c);
  stream_.submit([this, c, state, prepared] { prepared.ok() ? execute(c, *state) : state->complete(fail(prepared)); });
  return Work(std::move(state));
}

void Communicator::execute(const Collective& c, WorkState& state) {
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return state.complete(failure_);
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::Status status =
      options_.debug_collectives.value_or(false) ? check_same_collective(c, deadline) : absl::OkStatus();
  if (status.ok()) status = backend_->run(c, deadline);
  if (!status.ok()) status = fail(status);
  if (c.device.is_cpu()) return state.complete(status);
  // Queued on the device (a failed run may have queued part of it): its waiters order their streams after it from
  // here, so that what they free comes after it, while the watchdog settles it and this thread runs the next.
  absl::StatusOr<std::shared_ptr<const DeviceCompletion>> marked = mark_end_on_device(c);
  if (!marked.ok()) return state.complete(status.ok() ? fail(marked.status()) : status);
  state.complete(status, *marked);
  if (!status.ok()) return;
  watchdog_.submit([this, c, end = *std::move(marked), deadline] {
    (void)use_device_on_this_thread(c.device);  // where the event's last owner may destroy it
    const absl::Status settled = backend_->settle(c, end->event.get(), deadline);
    if (!settled.ok()) (void)fail(settled);  // the collectives the comm thread starts after fail with it
  });
}

absl::StatusOr<std::shared_ptr<const DeviceCompletion>> Communicator::mark_end_on_device(const Collective& c) {
  DeviceApi& api = *device_api(c.device);
  ZERO_ASSIGN_OR_RETURN(OwnedEvent event, OwnedEvent::create(api, c.device.index));
  ZERO_RETURN_IF_ERROR(api.record(event.get(), backend_->stream_for(c)));
  return std::make_shared<const DeviceCompletion>(DeviceCompletion{c.device, std::move(event)});
}

absl::Status Communicator::flush() {
  stream_.synchronize();  // then every collective posted so far is with the watchdog
  watchdog_.synchronize();
  absl::MutexLock lock(&mu_);
  return failure_;
}

absl::Status Communicator::fail(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;  // the backend was aborted with it already
    failure_ = status;
  }
  backend_->abort(status);
  return status;
}

absl::Status Communicator::check_same_collective(const Collective& c, absl::Time deadline) {
  std::vector<CollectiveFingerprint> all(world_size_);
  const absl::Status exchanged = backend_->exchange_fingerprints(CollectiveFingerprint::of(c), all, deadline);
  if (!exchanged.ok()) {  // the exchange is a collective of its own: name the one it was checking
    return absl::Status(exchanged.code(),
                        absl::StrCat("checking that every rank issues ", c.describe(), ": ", exchanged.message()));
  }
  return check_fingerprints_agree(all);
}

absl::Status run_rank(const std::function<absl::Status(Communicator&)>& fn, Communicator& comm, int ranks_sharing) {
  use_rank_share_of_cores(ranks_sharing);
  try {
    const absl::Status status = fn(comm);
    return status.ok() ? comm.flush() : status;  // a device collective may have failed after its Work completed
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("rank ", comm.rank(), " threw: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat("rank ", comm.rank(), " threw a non-standard exception"));
  }
}

absl::Status agree_across_ranks(Communicator& comm, const absl::Status& mine, absl::string_view task) {
  const int n = comm.world_size();
  int32_t failed = mine.ok() ? 0 : 1;
  std::vector<int32_t> all(n);
  ZERO_RETURN_IF_ERROR(comm.allgather(Tensor(&failed, DType::kI32, {1}), Tensor(all.data(), DType::kI32, {n})).wait());
  if (!mine.ok()) return mine;
  std::vector<int> failed_ranks;
  for (int r = 0; r < n; ++r) {
    if (all[r] != 0) failed_ranks.push_back(r);
  }
  if (failed_ranks.empty()) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat(task, " failed on rank(s) ", absl::StrJoin(failed_ranks, ", "), "; their errors say why"));
}

absl::StatusOr<std::vector<int>> ranks_unlike_rank_0(Communicator& comm, uint64_t fingerprint) {
  const int n = comm.world_size();
  int32_t mine[2] = {static_cast<int32_t>(fingerprint), static_cast<int32_t>(fingerprint >> 32)};
  std::vector<int32_t> all(2 * n);
  ZERO_RETURN_IF_ERROR(comm.allgather(Tensor(mine, DType::kI32, {2}), Tensor(all.data(), DType::kI32, {2 * n})).wait());
  std::vector<int> differ;
  for (int r = 1; r < n; ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) differ.push_back(r);
  }
  return differ;
}

}  // namespace zero
