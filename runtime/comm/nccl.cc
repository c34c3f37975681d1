#include "runtime/comm/nccl.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "runtime/allocator.h"
#include "runtime/comm/post_events.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/device_api.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

#ifdef ZERO_HAS_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>
#include "runtime/comm/mpi.h"
#endif

namespace zero {

namespace {

absl::Status nccl_status(ncclResult_t result, absl::string_view what, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(result),
                                          " (the last NCCL error in this process: ", ncclGetLastError(comm), ")"));
}

absl::StatusOr<ncclDataType_t> reduce_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32: return ncclInt32;
    default: return absl::InvalidArgumentError(absl::StrCat("nccl cannot reduce ", dtype_name(dtype)));
  }
}

ncclRedOp_t reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

// Every GPU the nccl ranks of this process use reaches the others' pool memory, which NCCL reads directly
// between the GPUs of one process.
absl::Status share_pool_memory_with_this_process_gpus(int device) {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  static std::vector<int> devices ABSL_GUARDED_BY(mu);
  absl::MutexLock lock(&mu);
  if (std::find(devices.begin(), devices.end(), device) != devices.end()) return absl::OkStatus();
  for (int other : devices) ZERO_RETURN_IF_ERROR(cuda_api().share_pool_memory(device, other));
  devices.push_back(device);
  return absl::OkStatus();
}

const char* at_bytes(const void* base, int64_t offset) { return static_cast<const char*>(base) + offset; }
char* at_bytes(void* base, int64_t offset) { return static_cast<char*>(base) + offset; }

// An NCCL call as enqueued: its answer and name, awaited (await_taken) after the launch that made it.
struct Issued {
  ncclResult_t result = ncclSuccess;
  const char* call = "";
};

class NcclBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<NcclBackend>> create(const ncclUniqueId& id, int rank, int world_size,
                                                             int device, const CommOptions& options) {
    const absl::Time deadline = absl::Now() + options.timeout;
    // This rank's threads (this one, and the communicator's that runs collectives) adopt its GPU.
    ZERO_RETURN_IF_ERROR(use_device_on_this_thread(Device::cuda(device)));
    ZERO_RETURN_IF_ERROR(share_pool_memory_with_this_process_gpus(device));
    ZERO_ASSIGN_OR_RETURN(OwnedStream stream, OwnedStream::create(cuda_api(), device));
    ZERO_ASSIGN_OR_RETURN(OwnedEvent done, OwnedEvent::create(cuda_api(), device));
    ZERO_ASSIGN_OR_RETURN(OwnedEvent allocated, OwnedEvent::create(cuda_api(), device));
    auto backend = std::unique_ptr<NcclBackend>(
        new NcclBackend(rank, world_size, device, std::move(stream), std::move(done), std::move(allocated)));
    backend->allocator_ = options.allocator;
    backend->shared_failure_ = options.shared_failure;
    if (backend->allocator_ == nullptr) {
      backend->own_allocator_ = std::make_unique<Allocator>(rank);
      backend->allocator_ = backend->own_allocator_.get();
    }
    // Room for one fingerprint and everyone's, for the debug check; the barrier reuses it.
    ZERO_ASSIGN_OR_RETURN(backend->scratch_,
                          backend->allocator_->allocate((world_size + 1) * sizeof(CollectiveFingerprint),
                                                        MemoryCategory::kCommBuffers, Device::cuda(device)));
    ZERO_RETURN_IF_ERROR(backend->wait_for_allocations());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t issued = ncclCommInitRankConfig(&backend->comm_, world_size, id, rank, &config);
    if (backend->comm_ == nullptr) {
      const absl::Status failed = nccl_status(issued, "ncclCommInitRankConfig");
      return failed.ok() ? absl::InternalError("ncclCommInitRankConfig returned no communicator") : failed;
    }
    const absl::Status joined = backend->await_taken(
        issued, absl::StrCat("ncclCommInitRankConfig (rank ", rank, " of ", world_size, "; every rank must join)"),
        deadline);
    if (!joined.ok()) {
      backend->abort(joined);  // now, so that in-process peers hear this cause, not the destructor's
      return joined;
    }
    backend->initialized_ = true;
    return backend;
  }

  ~NcclBackend() override {
    (void)use_device_on_this_thread(Device::cuda(device_));
    if (comm_ == nullptr) return;
    {
      absl::MutexLock lock(&comm_mu_);
      if (aborted_) return;  // the communicator is gone
    }
    // Finishes outstanding work, bounded: a communicator whose peers are gone, or whose initialisation
    // never completed, is aborted instead.
    absl::Status finalized = absl::AbortedError("ncclCommInitRankConfig did not complete");
    if (initialized_) {
      ncclResult_t issued = ncclSuccess;
      finalized = with_comm([&](ncclComm_t comm) {
        issued = ncclCommFinalize(comm);
        return absl::OkStatus();
      });
      if (finalized.ok()) finalized = await_taken(issued, "ncclCommFinalize", absl::Now() + absl::Seconds(30));
    }
    if (finalized.ok()) {
      ncclCommDestroy(comm_);
    } else {
      abort(finalized);
    }
  }

  absl::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  Device home_device() const override { return Device::cuda(device_); }
  // NCCL moves device memory; host buffers (the engine's loss, metrics and gradient-norm allreduces,
  // a few bytes each) are staged through device memory by run().
  bool supports(Device device) const override {
    return device.is_cpu() || (device.is_cuda() && device.index == device_);
  }

  // The stream is independent of the posting thread's current stream where its kernels run, so that collectives
  // overlap them. A device collective starts only after the kernels enqueued before its post: an event recorded
  // then, on that stream, which run() makes the stream wait for just before the NCCL call (so a
  // collective waits for no compute posted after it). Communicator calls prepare and queues the
  // collective in one step, so the events line up with the runs.
  absl::Status prepare(const Collective& c) override { return posted_.record(c); }
  Stream stream_for(const Collective&) const override { return stream_.get(); }

  absl::Status run(const Collective& c, absl::Time deadline) override {
    ZERO_RETURN_IF_ERROR(use_device_on_this_thread(Device::cuda(device_)));
    if (c.device.is_cpu()) return explain(run_staged(c, deadline), c.describe());
    absl::Status status = posted_.wait(stream_.get(), c);
    if (status.ok()) status = enqueue(c, deadline);
    return explain(status, c.describe());
  }

  // On the watchdog thread, beside run(): queries the event, the shared failure and NCCL's asynchronous error (under
  // comm_mu_, as every call on the communicator), as c10d's watchdog does, and what it finds failed or stalled is
  // aborted (abort(), through the communicator).
  absl::Status settle(const Collective& c, Event end, absl::Time deadline) override {
    ZERO_RETURN_IF_ERROR(use_device_on_this_thread(Device::cuda(device_)));
    return explain(wait_for(end, deadline), c.describe());
  }

  // Stages the fingerprints through device memory: NCCL moves only device buffers.
  absl::Status exchange_fingerprints(const CollectiveFingerprint& mine, std::span<CollectiveFingerprint> all,
                                     absl::Time deadline) override {
    ZERO_RETURN_IF_ERROR(use_device_on_this_thread(Device::cuda(device_)));
    constexpr size_t kBytes = sizeof(CollectiveFingerprint);
    Collective allgather{.op = CollectiveOp::kAllgather,
                         .dtype = DType::kU8,
                         .device = Device::cuda(device_),
                         .count = kBytes,
                         .send = scratch_.data(),
                         .recv = at_bytes(scratch_.data(), kBytes)};
    absl::Status status = reserve_pinned(all.size() * kBytes).status();
    if (status.ok()) status = upload(scratch_.data(), &mine, kBytes);
    if (status.ok()) status = enqueue(allgather, deadline);
    if (status.ok()) status = download(all.data(), allgather.recv, all.size() * kBytes, deadline);
    return explain(status, "the debug check of the collective sequence");
  }

  void abort(const absl::Status& cause) override {
    if (shared_failure_) shared_failure_->report(rank_, cause);  // before anything can block
    // Once, from whichever thread failed first: the comm thread (a staged collective) or the watchdog (a settle);
    // with the communicator to itself, and none calls it after.
    {
      absl::MutexLock lock(&comm_mu_);
      if (comm_ == nullptr || aborted_) return;
      aborted_ = true;
      abort_cause_ = cause;
      (void)use_device_on_this_thread(Device::cuda(device_));
      ncclCommAbort(comm_);
    }
    // Let the aborted kernels drain, within a bound, so that the staging buffers are free to go and a kernel that
    // ignored the abort cannot hang this thread. It does not bound a stream that waits for one of them (a Work's
    // waiter): that stream's next host wait hangs with it. No check between polls: the failure is already
    // reported, and the communicator is gone.
    absl::StatusOr<OwnedEvent> drained = OwnedEvent::create(api_, device_);
    if (drained.ok() && api_.record(drained->get(), stream_.get()).ok()) {
      (void)synchronize_until(api_, drained->get(), absl::Now() + absl::Seconds(10));
    }
  }

 private:
  NcclBackend(int rank, int world_size, int device, OwnedStream stream, OwnedEvent done, OwnedEvent allocated)
      : rank_(rank), world_size_(world_size), device_(device), stream_(std::move(stream)), done_(std::move(done)),
        allocated_(std::move(allocated)) {}

  // Device memory is allocated in the order of the allocating thread's current stream (runtime/device_memory.h): the
  // stream may touch new memory only after it.
  absl::Status wait_for_allocations() {
    return order_after(api_, stream_.get(), current_stream(Device::cuda(device_)), allocated_.get());
  }

  // Puts `c` on the stream, then waits, within the deadline, for the non-blocking communicator to take it. The
  // launch only enqueues; a peer's failure is answered after it, as the communicator's error, not the device's.
  absl::Status enqueue(const Collective& c, absl::Time deadline) {
    ncclDataType_t type = ncclUint8;  // what movement ops move
    if (is_reduction(c.op)) {
      ZERO_ASSIGN_OR_RETURN(type, reduce_type(c.dtype));
    }
    Issued issued;
    absl::Status taken;  // the communicator's refusal once aborted, not the device's failure
    const auto body = [&](const LaunchContext& ctx) {
      taken = with_comm([&](ncclComm_t comm) {
        issued = issue(comm, c, type, static_cast<cudaStream_t>(ctx.native_stream()));
        return absl::OkStatus();
      });
      return absl::OkStatus();
    };
    ZERO_RETURN_IF_ERROR(api_.launch(stream_.get(), KernelLaunch{.name = c.describe(), .accesses = {}, .body = body}));
    ZERO_RETURN_IF_ERROR(taken);
    return await_taken(issued.result, issued.call, deadline);
  }

  // fn(comm_) with the communicator to this thread: the comm thread (collectives) and the watchdog (settle's error
  // polls, an abort on a failure it finds) both call NCCL, which takes one thread at a time on a communicator (c10d's
  // NCCLComm locks the same way). Aborted once the communicator was aborted: it is gone.
  absl::Status with_comm(absl::FunctionRef<absl::Status(ncclComm_t)> fn) ABSL_LOCKS_EXCLUDED(comm_mu_) {
    absl::MutexLock lock(&comm_mu_);
    if (aborted_) {
      return absl::AbortedError(
          absl::StrCat("the NCCL communicator was aborted after a failure: ", abort_cause_.message()));
    }
    return fn(comm_);
  }

  // The communicator is non-blocking (so initialisation can time out instead of hanging): a call may answer
  // ncclInProgress (`issued`), and the next call must wait until the communicator is no longer in progress. A peer's
  // failure reported to shared_failure_ ends the wait at once.
  absl::Status await_taken(ncclResult_t issued, absl::string_view what, absl::Time deadline) {
    ncclResult_t state = issued;
    while (state == ncclInProgress) {
      if (shared_failure_) ZERO_RETURN_IF_ERROR(shared_failure_->first());
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(what, " did not complete before the deadline"));
      }
      absl::SleepFor(absl::Microseconds(20));
      ZERO_RETURN_IF_ERROR(with_comm([&](ncclComm_t comm) {
        const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        return r == ncclSuccess ? absl::OkStatus() : nccl_status(r, what, comm);
      }));
    }
    return with_comm([&](ncclComm_t comm) { return nccl_status(state, what, comm); });
  }

  // The NCCL calls of `c` on `s`, reductions in `type`. Movement ops move bytes; gather and scatter are grouped
  // point-to-point calls.
  Issued issue(ncclComm_t comm, const Collective& c, ncclDataType_t type, cudaStream_t s) {
    const int64_t chunk = c.chunk_bytes();
    const ncclRedOp_t op = reduce_op(c.reduce_op);
    switch (c.op) {
      case CollectiveOp::kAllreduce:
        return {ncclAllReduce(c.send, c.recv, c.count, type, op, comm, s), "ncclAllReduce"};
      case CollectiveOp::kReduceScatter:
        return {ncclReduceScatter(c.send, c.recv, c.count, type, op, comm, s), "ncclReduceScatter"};
      case CollectiveOp::kReduce: return {ncclReduce(c.send, c.recv, c.count, type, op, c.root, comm, s), "ncclReduce"};
      case CollectiveOp::kAllgather: return {ncclAllGather(c.send, c.recv, chunk, ncclUint8, comm, s), "ncclAllGather"};
      case CollectiveOp::kBroadcast:
        return {ncclBroadcast(c.send, c.recv, chunk, ncclUint8, c.root, comm, s), "ncclBroadcast"};
      case CollectiveOp::kGather:
      case CollectiveOp::kScatter: return issue_grouped(comm, c, s);
      case CollectiveOp::kBarrier:  // NCCL has none: a one-element allreduce every rank must join
        return {ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclInt32, ncclSum, comm, s), "ncclAllReduce"};
    }
    return {ncclInvalidArgument, "an unknown collective"};
  }

  // Gather: the root receives every rank's chunk; scatter: it sends each rank its own. The non-blocking communicator
  // may answer ncclInProgress to each call of the group, which settles after the launch with the rest.
  Issued issue_grouped(ncclComm_t comm, const Collective& c, cudaStream_t s) {
    const int64_t chunk = c.chunk_bytes();
    const bool gather = c.op == CollectiveOp::kGather;
    const auto going = [](const Issued& i) { return i.result == ncclSuccess || i.result == ncclInProgress; };
    Issued issued{ncclGroupStart(), "ncclGroupStart"};
    if (!going(issued)) return issued;
    for (int r = 0; rank_ == c.root && r < world_size_ && going(issued); ++r) {
      issued = gather ? Issued{ncclRecv(at_bytes(c.recv, r * chunk), chunk, ncclUint8, r, comm, s), "ncclRecv"}
                      : Issued{ncclSend(at_bytes(c.send, r * chunk), chunk, ncclUint8, r, comm, s), "ncclSend"};
    }
    if (going(issued)) {
      issued = gather ? Issued{ncclSend(c.send, chunk, ncclUint8, c.root, comm, s), "ncclSend"}
                      : Issued{ncclRecv(c.recv, chunk, ncclUint8, c.root, comm, s), "ncclRecv"};
    }
    const ncclResult_t end = ncclGroupEnd();
    return going(issued) ? Issued{end, "ncclGroupEnd"} : issued;
  }

  // Bytes of `c`'s send and recv buffers on this rank (see Collective); in-place ops share one.
  std::pair<int64_t, int64_t> buffer_bytes(const Collective& c) const {
    const int64_t chunk = c.chunk_bytes(), all = chunk * world_size_;
    switch (c.op) {
      case CollectiveOp::kReduceScatter:
      case CollectiveOp::kScatter: return {all, chunk};
      case CollectiveOp::kAllgather:
      case CollectiveOp::kGather: return {chunk, all};
      case CollectiveOp::kBarrier: return {0, 0};
      default: return {0, chunk};  // allreduce, broadcast, reduce: in place
    }
  }

  // A collective on host buffers: copied to device memory, run there, and the result copied back.
  absl::Status run_staged(const Collective& c, absl::Time deadline) {
    const auto [send_bytes, recv_bytes] = buffer_bytes(c);
    ZERO_RETURN_IF_ERROR(reserve_staging(send_bytes + recv_bytes));
    const absl::Status status = run_through(c, staging_.data(), send_bytes, recv_bytes, deadline);
    // After a failure NCCL may still be writing the staging buffer: abort, which ends its kernels.
    if (!status.ok()) abort(status);
    return status;
  }

  // The staging buffer only grows (host collectives are a few bytes), so the stream rarely has to wait for new
  // memory.
  absl::Status reserve_staging(int64_t nbytes) {
    if (staging_.nbytes() >= nbytes) return absl::OkStatus();
    staging_.reset();  // its last collective has finished
    ZERO_ASSIGN_OR_RETURN(staging_, allocator_->allocate(nbytes, MemoryCategory::kCommBuffers, Device::cuda(device_)));
    return wait_for_allocations();
  }

  absl::Status run_through(const Collective& c, void* staging, int64_t send_bytes, int64_t recv_bytes,
                           absl::Time deadline) {
    Collective on_device = c;
    on_device.device = Device::cuda(device_);
    on_device.recv = at_bytes(staging, send_bytes);
    on_device.send = send_bytes == 0 ? on_device.recv : staging;
    const void* source = send_bytes == 0 ? c.recv : c.send;
    ZERO_RETURN_IF_ERROR(reserve_pinned(std::max(send_bytes, recv_bytes)).status());
    if (source != nullptr) {
      ZERO_RETURN_IF_ERROR(
          upload(const_cast<void*>(on_device.send), source, send_bytes == 0 ? recv_bytes : send_bytes));
    }
    ZERO_RETURN_IF_ERROR(enqueue(on_device, deadline));
    if (c.recv == nullptr) return finish(deadline);
    return download(c.recv, on_device.recv, recv_bytes, deadline);
  }

  // The pinned memory for the staging copies, grown to `bytes`. Growing frees the old buffer, so an operation
  // reserves what all its copies need before the first, and ends in finish(): the next may then overwrite it.
  absl::StatusOr<void*> reserve_pinned(size_t bytes) {
    if (bytes > pinned_.bytes()) {
      pinned_ = PinnedBuffer();
      ZERO_ASSIGN_OR_RETURN(pinned_, PinnedBuffer::allocate(api_, bytes));
    }
    return pinned_.data();
  }

  // Host bytes to device memory, in the stream's order, through pinned memory.
  absl::Status upload(void* device_dst, const void* host_src, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    ZERO_ASSIGN_OR_RETURN(void* pinned, reserve_pinned(bytes));
    std::memcpy(pinned, host_src, bytes);
    return api_.copy_async(device_dst, pinned, bytes, stream_.get());
  }

  // Device bytes to the host once the stream reached them, through pinned memory: the wait watches the deadline
  // and NCCL's errors, which a host-blocking copy behind a collective whose peer died would not.
  absl::Status download(void* host_dst, const void* device_src, size_t bytes, absl::Time deadline) {
    if (bytes == 0) return finish(deadline);
    ZERO_ASSIGN_OR_RETURN(void* pinned, reserve_pinned(bytes));
    ZERO_RETURN_IF_ERROR(api_.copy_async(pinned, device_src, bytes, stream_.get()));
    ZERO_RETURN_IF_ERROR(finish(deadline));
    std::memcpy(host_dst, pinned, bytes);
    return absl::OkStatus();
  }

  // Waits for the stream (on the comm thread), watching for asynchronous NCCL errors.
  absl::Status finish(absl::Time deadline) {
    ZERO_RETURN_IF_ERROR(api_.record(done_.get(), stream_.get()));
    return wait_for(done_.get(), deadline);
  }

  // Waits until `end` happened, watching for asynchronous NCCL errors, and asks once more after: work an abort ended
  // (from the other thread) completes too, and must not pass for done.
  absl::Status wait_for(Event end, absl::Time deadline) {
    ZERO_RETURN_IF_ERROR(synchronize_until(api_, end, deadline, [this] { return async_error(); }));
    return async_error();
  }

  // A peer's failure (in this process), NCCL's asynchronous error (a peer failed, the network broke), or the abort.
  absl::Status async_error() {
    if (shared_failure_) ZERO_RETURN_IF_ERROR(shared_failure_->first());
    return with_comm([](ncclComm_t comm) {
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) return nccl_status(r, "", comm);
      return nccl_status(state, "NCCL reported an asynchronous error", comm);
    });
  }

  absl::Status explain(const absl::Status& status, absl::string_view what) const {
    if (status.ok()) return status;
    const std::string where = absl::StrCat("nccl rank ", rank_, " (cuda:", device_, ") in ", what, ": ");
    if (absl::IsDeadlineExceeded(status)) {
      return absl::DeadlineExceededError(absl::StrCat(where, "timed out (", status.message(),
                                                      "); a peer stopped answering or issued different collectives "
                                                      "(ZERO_DEBUG_COLLECTIVES=1 names the ranks that diverge)"));
    }
    return absl::Status(status.code(), absl::StrCat(where, status.message()));
  }

  CudaApi& api_ = cuda_api();
  const int rank_;
  const int world_size_;
  const int device_;
  OwnedStream stream_;                             // every collective and staging copy, from the comm thread
  OwnedEvent done_;                                // finish(), on the comm thread
  OwnedEvent allocated_;                           // wait_for_allocations()
  PostEvents posted_;                              // prepare() records, run() waits
  std::shared_ptr<SharedFailure> shared_failure_;  // CommOptions::shared_failure
  Allocator* allocator_ = nullptr;                 // CommOptions::allocator, or own_allocator_
  std::unique_ptr<Allocator> own_allocator_;       // when CommOptions names none
  Buffer scratch_;                                 // device memory, (world_size + 1) fingerprints
  Buffer staging_;                                 // device memory for host collectives, grown as needed
  PinnedBuffer pinned_;                            // the host side of the staging copies, grown as needed
  absl::Mutex comm_mu_;
  ncclComm_t comm_ = nullptr;  // called under comm_mu_ once other threads can (with_comm)
  bool initialized_ = false;   // ncclCommInitRankConfig completed
  bool aborted_ ABSL_GUARDED_BY(comm_mu_) = false;
  absl::Status abort_cause_ ABSL_GUARDED_BY(comm_mu_);  // named by every call refused after
};

absl::Status check_device(int rank, int device) {
  const int visible = cuda_device_count();
  if (device >= 0 && device < visible) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("nccl rank ", rank, " wants cuda:", device, " but ", visible, " CUDA device(s) are visible",
                   visible == 0 ? absl::StrCat(" (", why_no_cuda_device(), ")") : "",
                   "; run one rank per GPU (LOCAL_RANK picks it), or use the local or mpi backend"));
}

// The GPU of the process with this local rank: that index among the visible devices, or the only one
// when each process sees just its own (CUDA_VISIBLE_DEVICES set per process, as SLURM's
// --gpus-per-task does).
absl::StatusOr<int> gpu_of_local_rank(int rank, int local_rank) {
  if (cuda_device_count() == 1) return 0;
  ZERO_RETURN_IF_ERROR(check_device(rank, local_rank));
  return local_rank;
}

absl::StatusOr<std::unique_ptr<Communicator>> communicator_from_id(const ncclUniqueId& id, int rank, int world_size,
                                                                   int device, CommOptions options) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<NcclBackend> backend,
                        NcclBackend::create(id, rank, world_size, device, options));
  return std::make_unique<Communicator>(std::move(backend), options);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(TcpStore& store, int rank, int world_size,
                                                                     int device, CommOptions options,
                                                                     absl::string_view key) {
  ZERO_RETURN_IF_ERROR(check_device(rank, device));
  ncclUniqueId id;
  if (rank == 0) {
    ZERO_RETURN_IF_ERROR(nccl_status(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    ZERO_RETURN_IF_ERROR(store.set(key, absl::string_view(id.internal, sizeof(id.internal))));
  } else {
    ZERO_ASSIGN_OR_RETURN(const std::string bytes, store.get(key));
    if (bytes.size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat("the NCCL unique id under '", key, "' has ", bytes.size(), " bytes, not ",
                                              sizeof(id.internal), "; is another program using the key?"));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  return communicator_from_id(id, rank, world_size, device, options);
}

absl::StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(const DistributedEnv& env, CommOptions options) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store, TcpStore::create(env, options.timeout));
  // Initialisation is collective: when it returns every rank has read the id, so the store may go.
  ZERO_ASSIGN_OR_RETURN(const int device, gpu_of_local_rank(env.rank, env.local_rank));
  return make_nccl_communicator(*store, env.rank, env.world_size, device, options);
}

std::vector<absl::Status> run_nccl_ranks_in_process(int world_size,
                                                    const std::function<absl::Status(Communicator&)>& fn,
                                                    CommOptions options) {
  if (world_size < 1) return {absl::InvalidArgumentError(absl::StrCat("nccl in one process: ", world_size, " ranks"))};
  // Checked up front: a rank without its GPU would leave the others waiting in NCCL's initialisation.
  if (const int visible = cuda_device_count(); visible < world_size) {
    return std::vector<absl::Status>(world_size, absl::FailedPreconditionError(absl::StrCat(
                                                     "nccl in one process: ", world_size, " ranks need ", world_size,
                                                     " GPUs, one each, and ", visible, " CUDA device(s) are visible (",
                                                     why_no_cuda_device(), "); use as many ranks as GPUs")));
  }
  absl::StatusOr<std::unique_ptr<TcpStore>> server =
      TcpStore::create({.host = "127.0.0.1", .port = 0, .is_server = true, .timeout = options.timeout});
  if (!server.ok()) return std::vector<absl::Status>(world_size, server.status());
  // The first rank to fail, in its setup, a collective or its own work, fails its peers' waits at once.
  options.shared_failure = std::make_shared<SharedFailure>();
  std::vector<absl::Status> statuses(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<TcpStore> client;
      std::unique_ptr<Communicator> comm;  // outlives the report below: its drain must not keep peers waiting
      statuses[r] = [&]() -> absl::Status {
        if (r > 0) {
          ZERO_ASSIGN_OR_RETURN(
              client, TcpStore::create({.host = "127.0.0.1", .port = (*server)->port(), .timeout = options.timeout}));
        }
        ZERO_ASSIGN_OR_RETURN(comm, make_nccl_communicator(r == 0 ? **server : *client, r, world_size, r, options));
        return run_rank(fn, *comm, world_size);
      }();
      if (!statuses[r].ok()) options.shared_failure->report(r, statuses[r]);  // in its setup or its work
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

#ifdef ZERO_HAS_MPI
absl::StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator_from_mpi(CommOptions options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      return absl::UnavailableError("MPI_Init_thread failed; run under mpirun");
    }
  }
  int rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  const int local_rank = mpi_host_placement().local_rank;
  // Every rank joins the broadcast, even one without a GPU, so none is left waiting in it; whether rank 0
  // got an id travels with it, so that no rank starts NCCL's initialisation with a blank one.
  struct {
    int32_t ok;
    ncclUniqueId id;
  } shared{};
  const absl::Status status =
      rank == 0 ? nccl_status(ncclGetUniqueId(&shared.id), "ncclGetUniqueId") : absl::OkStatus();
  shared.ok = status.ok() ? 1 : 0;
  if (MPI_Bcast(&shared, sizeof(shared), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
    return absl::UnavailableError("MPI_Bcast of the NCCL unique id failed");
  }
  ZERO_RETURN_IF_ERROR(status);
  if (shared.ok == 0) return absl::UnavailableError("rank 0 could not get an NCCL unique id; see its error");
  ZERO_ASSIGN_OR_RETURN(const int device, gpu_of_local_rank(rank, local_rank));
  return communicator_from_id(shared.id, rank, world_size, device, options);
}
#endif

}  // namespace zero
