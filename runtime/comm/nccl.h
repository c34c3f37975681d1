// The `nccl` backend: one rank per GPU, collectives issued by NCCL on the backend's own CUDA stream.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/tcp_store.h"

namespace zero {

// Buffers are on this rank's GPU (home_device()), or on the host, staged through device memory (meant
// for a few bytes: losses, metrics, norms). The backend's stream is non-blocking, so collectives overlap the
// kernels: what the posting thread queued on its current stream before the call is ordered before the collective
// by an event recorded at the call (PostEvents); work on any other stream must be ordered there, or finished, by
// the caller. A device collective's Work completes once it is queued, and its wait() makes the waiter's current
// stream wait for it; the communicator's watchdog thread then settles it (its event polled against the deadline,
// NCCL's errors asked between polls) while the comm thread queues the next; a failure found there aborts NCCL and
// fails the collectives the comm thread starts after. Both threads call NCCL, one at a time (a mutex). A host
// collective's Work completes once its result is on the host. The backend's only memory of its own, device scratch for
// the barrier, the debug check and the staged host collectives, is accounted to CommOptions::allocator when one is
// named.
//
// Numerics: NCCL reduces bf16 and fp16 in their own precision (every partial sum rounds to the dtype),
// fp32 in fp32, and in its own (ring or tree) order, so reductions match the local and mpi backends
// only up to reduction order and rounding; data movement (allgather, broadcast, gather, scatter) is
// exact. Max follows NCCL's NaN handling.
//
// Failure: each collective is polled (CUDA event and ncclCommGetAsyncError) until the communicator's
// deadline; a timeout or an asynchronous NCCL error fails it naming the collective. After the first
// failure the communicator calls ncclCommAbort: this rank's pending NCCL work stops, and peers that
// wait on it fail at their own deadline (or sooner, when their transport reports the lost peer).

// Rank env.rank of env.world_size on GPU env.local_rank (or on the only GPU when each process sees just
// its own, as CUDA_VISIBLE_DEVICES per process gives). Rank 0 hosts a TcpStore on MASTER_PORT and
// publishes the NCCL unique id there; the others fetch it. Fails rather than hangs when a rank does not
// show up within options.timeout.
absl::StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(const DistributedEnv& env,
                                                                     CommOptions options = CommOptions::from_env());

// The same over a store the caller already has (several ranks in one process, or one store shared with
// other setup). Rank 0 sets `key`; every rank of the group must pass the same key.
absl::StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(TcpStore& store, int rank, int world_size,
                                                                     int device, CommOptions options,
                                                                     absl::string_view key = "zero/nccl/unique_id");

// One process driving `world_size` GPUs: runs fn on as many threads, rank r on cuda:r with its nccl
// communicator, set up through a TcpStore on 127.0.0.1 that this call hosts; returns each rank's status.
// Fails at once on every rank when fewer than world_size GPUs are visible. A rank that fails, in its
// setup, a collective or its own work, makes its peers' waits fail at once (CommOptions::shared_failure),
// with Aborted naming it.
std::vector<absl::Status> run_nccl_ranks_in_process(int world_size,
                                                    const std::function<absl::Status(Communicator&)>& fn,
                                                    CommOptions options = CommOptions::from_env());

#ifdef ZERO_HAS_MPI
// Rank and world size of MPI_COMM_WORLD; the GPU is the rank's index among the ranks of its node
// (MPI_COMM_TYPE_SHARED), or the only visible one; the unique id is broadcast from rank 0 with
// MPI_Bcast. Initialises MPI (MPI_THREAD_MULTIPLE) if the program has not; finalising it is the
// program's job.
absl::StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator_from_mpi(
    CommOptions options = CommOptions::from_env());
#endif

}  // namespace zero
