#include "runtime/comm/nccl.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "runtime/allocator.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/memory_pool.h"
#include "runtime/cuda/stream.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

#ifdef ZERO_HAS_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>
#endif

namespace zero {

namespace {

absl::Status nccl_status(ncclResult_t result, absl::string_view what, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(result),
                                          " (the last NCCL error in this process: ", ncclGetLastError(comm), ")"));
}

// The communicator is non-blocking (so initialisation can time out instead of hanging): a call may
// answer ncclInProgress, and the next call must wait until the communicator settled. A peer's failure
// reported to `shared` ends the wait at once.
absl::Status settle(ncclComm_t comm, ncclResult_t issued, absl::string_view what, absl::Time deadline,
                    const SharedFailure* shared) {
  ncclResult_t state = issued;
  while (state == ncclInProgress) {
    if (shared != nullptr) ZERO_RETURN_IF_ERROR(shared->first());
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, " did not complete before the deadline"));
    }
    absl::SleepFor(absl::Microseconds(20));
    if (ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) return nccl_status(r, what, comm);
  }
  return nccl_status(state, what, comm);
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
  for (int other : devices) ZERO_RETURN_IF_ERROR(share_pool_memory(device, other));
  devices.push_back(device);
  return absl::OkStatus();
}

const char* at_bytes(const void* base, int64_t offset) { return static_cast<const char*>(base) + offset; }
char* at_bytes(void* base, int64_t offset) { return static_cast<char*>(base) + offset; }

class NcclBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<NcclBackend>> create(const ncclUniqueId& id, int rank, int world_size,
                                                             int device, const CommOptions& options) {
    const absl::Time deadline = absl::Now() + options.timeout;
    // This rank's threads (this one, and the communicator's that runs collectives) adopt its GPU.
    ZERO_RETURN_IF_ERROR(use_device_on_this_thread(Device::cuda(device)));
    ZERO_RETURN_IF_ERROR(share_pool_memory_with_this_process_gpus(device));
    ZERO_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::create(device));
    ZERO_ASSIGN_OR_RETURN(CudaEvent done, CudaEvent::create(device));
    ZERO_ASSIGN_OR_RETURN(CudaEvent allocated, CudaEvent::create(device));
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
    ZERO_RETURN_IF_ERROR(backend->stream_.wait_for_default_stream(backend->allocated_));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t issued = ncclCommInitRankConfig(&backend->comm_, world_size, id, rank, &config);
    if (backend->comm_ == nullptr) {
      const absl::Status failed = nccl_status(issued, "ncclCommInitRankConfig");
      return failed.ok() ? absl::InternalError("ncclCommInitRankConfig returned no communicator") : failed;
    }
    ZERO_RETURN_IF_ERROR(
        settle(backend->comm_, issued,
               absl::StrCat("ncclCommInitRankConfig (rank ", rank, " of ", world_size, "; every rank must join)"),
               deadline, options.shared_failure.get()));
    backend->initialized_ = true;
    return backend;
  }

  ~NcclBackend() override {
    (void)use_device_on_this_thread(Device::cuda(device_));
    if (comm_ == nullptr || aborted_) return;
    // Finishes outstanding work, bounded: a communicator whose peers are gone, or whose initialisation
    // never completed, is aborted instead.
    const absl::Status finalized = initialized_ ? settle(comm_, ncclCommFinalize(comm_), "ncclCommFinalize",
                                                         absl::Now() + absl::Seconds(30), shared_failure_.get())
                                                : absl::AbortedError("ncclCommInitRankConfig did not complete");
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

  // The stream is independent of the default stream where the kernels run, so that collectives overlap
  // them. A device collective starts only after the kernels enqueued before its post: an event recorded
  // then, on the posting thread, which run() makes the stream wait for just before the NCCL call (so a
  // collective waits for no compute posted after it). Communicator calls prepare and queues the
  // collective in one step, so the events line up with the runs.
  absl::Status prepare(const Collective& c) override {
    if (!c.device.is_cuda()) return absl::OkStatus();
    ZERO_ASSIGN_OR_RETURN(CudaEvent posted, spare_event());
    ZERO_RETURN_IF_ERROR(posted.record_on_default_stream());
    absl::MutexLock lock(&events_mu_);
    posted_.push_back(std::move(posted));
    return absl::OkStatus();
  }

  absl::Status run(const Collective& c, absl::Time deadline) override {
    ZERO_RETURN_IF_ERROR(use_device_on_this_thread(Device::cuda(device_)));
    if (c.device.is_cpu()) return explain(run_staged(c, deadline), c.describe());
    absl::Status status = wait_for_post(c);
    if (status.ok()) status = enqueue(c, deadline);
    if (status.ok()) status = finish(deadline);
    return explain(status, c.describe());
  }

  // Stages the fingerprints through device memory: NCCL moves only device buffers.
  absl::Status exchange_fingerprints(const CollectiveFingerprint& mine, std::span<CollectiveFingerprint> all,
                                     absl::Time deadline) override {
    ZERO_RETURN_IF_ERROR(use_device_on_this_thread(Device::cuda(device_)));
    constexpr size_t kBytes = sizeof(CollectiveFingerprint);
    void* mine_on_device = scratch_.data();
    void* all_on_device = at_bytes(mine_on_device, kBytes);
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mine_on_device, &mine, kBytes, cudaMemcpyHostToDevice, stream_.get()));
    absl::Status status =
        settle(comm_, ncclAllGather(mine_on_device, all_on_device, kBytes, ncclUint8, comm_, stream_.get()),
               "ncclAllGather", deadline, shared_failure_.get());
    if (status.ok()) status = finish(deadline);
    ZERO_RETURN_IF_ERROR(explain(status, "the debug check of the collective sequence"));
    ZERO_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(all.data(), all_on_device, all.size() * kBytes, cudaMemcpyDeviceToHost, stream_.get()));
    return stream_.synchronize(deadline);
  }

  void abort(const absl::Status& cause) override {
    if (shared_failure_) shared_failure_->report(rank_, cause);  // before anything can block
    if (comm_ == nullptr || aborted_) return;
    aborted_ = true;
    (void)use_device_on_this_thread(Device::cuda(device_));
    ncclCommAbort(comm_);
    // The buffers of the failed collectives are freed next in default-stream order, which does not wait
    // for this stream: let the aborted kernels drain first, within a bound, so a kernel that ignored the
    // abort cannot hang the failing rank.
    (void)stream_.synchronize(absl::Now() + absl::Seconds(10));
  }

 private:
  NcclBackend(int rank, int world_size, int device, CudaStream stream, CudaEvent done, CudaEvent allocated)
      : rank_(rank), world_size_(world_size), device_(device), stream_(std::move(stream)), done_(std::move(done)),
        allocated_(std::move(allocated)) {}

  absl::StatusOr<CudaEvent> spare_event() {
    {
      absl::MutexLock lock(&events_mu_);
      if (!spare_.empty()) {
        CudaEvent event = std::move(spare_.back());
        spare_.pop_back();
        return event;
      }
    }
    return CudaEvent::create(device_);
  }

  // Makes the stream wait for the event prepare() recorded when `c` was posted.
  absl::Status wait_for_post(const Collective& c) {
    absl::MutexLock lock(&events_mu_);
    if (posted_.empty()) return absl::InternalError(absl::StrCat(c.describe(), " was not prepared when posted"));
    CudaEvent posted = std::move(posted_.front());
    posted_.pop_front();
    const absl::Status status = stream_.wait(posted);  // takes the record as it is now; the event may go again
    spare_.push_back(std::move(posted));
    return status;
  }

  // Puts `c` on the stream. Movement ops move bytes; gather and scatter are grouped point-to-point calls.
  absl::Status enqueue(const Collective& c, absl::Time deadline) {
    const cudaStream_t s = stream_.get();
    const int64_t chunk = c.chunk_bytes();
    const auto issued = [&](ncclResult_t r) {
      return settle(comm_, r, "enqueueing the NCCL call", deadline, shared_failure_.get());
    };
    const auto grouped = [&](auto&& calls) -> absl::Status {
      ZERO_RETURN_IF_ERROR(nccl_status(ncclGroupStart(), "ncclGroupStart", comm_));
      const absl::Status status = calls();
      const ncclResult_t end = ncclGroupEnd();
      ZERO_RETURN_IF_ERROR(status);
      return issued(end);
    };
    switch (c.op) {
      case CollectiveOp::kAllreduce: {
        ZERO_ASSIGN_OR_RETURN(const ncclDataType_t type, reduce_type(c.dtype));
        return issued(ncclAllReduce(c.send, c.recv, c.count, type, reduce_op(c.reduce_op), comm_, s));
      }
      case CollectiveOp::kReduceScatter: {
        ZERO_ASSIGN_OR_RETURN(const ncclDataType_t type, reduce_type(c.dtype));
        return issued(ncclReduceScatter(c.send, c.recv, c.count, type, reduce_op(c.reduce_op), comm_, s));
      }
      case CollectiveOp::kReduce: {
        ZERO_ASSIGN_OR_RETURN(const ncclDataType_t type, reduce_type(c.dtype));
        return issued(ncclReduce(c.send, c.recv, c.count, type, reduce_op(c.reduce_op), c.root, comm_, s));
      }
      case CollectiveOp::kAllgather: return issued(ncclAllGather(c.send, c.recv, chunk, ncclUint8, comm_, s));
      case CollectiveOp::kBroadcast: return issued(ncclBroadcast(c.send, c.recv, chunk, ncclUint8, c.root, comm_, s));
      case CollectiveOp::kGather:
        return grouped([&]() -> absl::Status {
          for (int r = 0; rank_ == c.root && r < world_size_; ++r) {
            ZERO_RETURN_IF_ERROR(
                nccl_status(ncclRecv(at_bytes(c.recv, r * chunk), chunk, ncclUint8, r, comm_, s), "ncclRecv", comm_));
          }
          return nccl_status(ncclSend(c.send, chunk, ncclUint8, c.root, comm_, s), "ncclSend", comm_);
        });
      case CollectiveOp::kScatter:
        return grouped([&]() -> absl::Status {
          for (int r = 0; rank_ == c.root && r < world_size_; ++r) {
            ZERO_RETURN_IF_ERROR(
                nccl_status(ncclSend(at_bytes(c.send, r * chunk), chunk, ncclUint8, r, comm_, s), "ncclSend", comm_));
          }
          return nccl_status(ncclRecv(c.recv, chunk, ncclUint8, c.root, comm_, s), "ncclRecv", comm_);
        });
      case CollectiveOp::kBarrier:  // NCCL has none: a one-element allreduce every rank must join
        return issued(ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclInt32, ncclSum, comm_, s));
    }
    return absl::InternalError("unknown collective");
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

  // The staging buffer only grows (host collectives are a few bytes), so this stream rarely has to wait
  // for the default stream, where device memory is allocated in order (runtime/device_memory.h), before
  // it may touch new memory.
  absl::Status reserve_staging(int64_t nbytes) {
    if (staging_.nbytes() >= nbytes) return absl::OkStatus();
    staging_.reset();  // its last collective has finished
    ZERO_ASSIGN_OR_RETURN(staging_, allocator_->allocate(nbytes, MemoryCategory::kCommBuffers, Device::cuda(device_)));
    return stream_.wait_for_default_stream(allocated_);
  }

  absl::Status run_through(const Collective& c, void* staging, int64_t send_bytes, int64_t recv_bytes,
                           absl::Time deadline) {
    Collective on_device = c;
    on_device.device = Device::cuda(device_);
    on_device.recv = at_bytes(staging, send_bytes);
    on_device.send = send_bytes == 0 ? on_device.recv : staging;
    const cudaStream_t s = stream_.get();
    const void* source = send_bytes == 0 ? c.recv : c.send;
    if (source != nullptr) {
      ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(const_cast<void*>(on_device.send), source,
                                                send_bytes == 0 ? recv_bytes : send_bytes, cudaMemcpyHostToDevice, s));
    }
    ZERO_RETURN_IF_ERROR(enqueue(on_device, deadline));
    // Finish first, watching the deadline and NCCL's errors: a copy into pageable host memory queued
    // behind the collective would block this thread until it completed, which a dead peer never lets.
    ZERO_RETURN_IF_ERROR(finish(deadline));
    if (c.recv == nullptr) return absl::OkStatus();
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(c.recv, on_device.recv, recv_bytes, cudaMemcpyDeviceToHost, s));
    return stream_.synchronize(deadline);
  }

  // Waits for the stream, watching for asynchronous NCCL errors (a peer failed, the network broke).
  absl::Status finish(absl::Time deadline) {
    ZERO_RETURN_IF_ERROR(done_.record(stream_));
    return done_.synchronize(deadline, [this]() -> absl::Status {
      if (shared_failure_) ZERO_RETURN_IF_ERROR(shared_failure_->first());
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) return nccl_status(r, "", comm_);
      return nccl_status(state, "NCCL reported an asynchronous error", comm_);
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

  const int rank_;
  const int world_size_;
  const int device_;
  CudaStream stream_;      // every NCCL call and staging copy, from the comm thread
  CudaEvent done_;         // finish()
  CudaEvent allocated_;    // ordering the stream after new device memory: the scratch, then staging
  absl::Mutex events_mu_;  // the posting thread's prepare() and the comm thread's run() share these:
  std::deque<CudaEvent> posted_ ABSL_GUARDED_BY(events_mu_);  // one per device collective prepared, not yet run
  std::vector<CudaEvent> spare_ ABSL_GUARDED_BY(events_mu_);  // recycled
  std::shared_ptr<SharedFailure> shared_failure_;             // CommOptions::shared_failure
  Allocator* allocator_ = nullptr;                            // CommOptions::allocator, or own_allocator_
  std::unique_ptr<Allocator> own_allocator_;                  // when CommOptions names none
  Buffer scratch_;                                            // device memory, (world_size + 1) fingerprints
  Buffer staging_;                                            // device memory for host collectives, grown as needed
  ncclComm_t comm_ = nullptr;
  bool initialized_ = false;  // ncclCommInitRankConfig completed
  bool aborted_ = false;
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
        return run_rank(fn, *comm);
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
  int rank = 0, world_size = 1, local_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
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
