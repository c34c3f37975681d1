// The `mpi` backend: one rank per process (Open MPI, mpirun), results bitwise identical to `local`.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"

namespace zero {

// Joins MPI_COMM_WORLD as this process's rank, on a private duplicate of it. Initialises MPI with
// MPI_THREAD_MULTIPLE if nobody did (and finalises it at exit), because collectives are issued from the
// communicator's own thread; fails if MPI was initialised with a lower thread level.
//
// How it works: data moves as bytes through non-blocking MPI calls polled until the deadline, so a
// collective that does not finish in options.timeout fails with DeadlineExceeded naming it. Reductions
// never use MPI's reduction ops: reduce_scatter is an alltoall of chunks then reduce_in_rank_order,
// allreduce an alltoallv of chunk_range() ranges, a rank-order reduction of one's own range and an
// allgatherv, reduce a gather to root then a rank-order reduction; so every result equals the local
// backend's bit for bit. Messages are split into pieces of at most ZERO_MPI_PIECE_BYTES bytes (default
// 64 MiB, never above INT_MAX / world size), which also bounds the scratch memory (world size x piece,
// accounted under kCommBuffers in options.allocator). A zero-element collective moves nothing and returns
// at once.
//
// Failure: a failed MPI collective cannot be cancelled or recovered, so the first failure on any rank
// (timeout, MPI error, diverging collectives in debug mode) prints "zero: rank R: <status>" to stderr and
// calls MPI_Abort(MPI_COMM_WORLD, 1), which ends every rank of the job instead of leaving them blocked.
// Without ZERO_DEBUG_COLLECTIVES=1, ranks issuing different collectives are undefined behaviour in MPI;
// expect a timeout at best.
absl::StatusOr<std::unique_ptr<Communicator>> make_mpi_communicator(CommOptions options = CommOptions::from_env());

// Runs fn with the communicator `make` builds for this mpirun-launched process (MPI itself, or NCCL
// bootstrapped through MPI); on error (or an exception) prints "zero: rank R: <status>" to stderr and
// MPI_Aborts so every rank ends; returns the process exit code (0 on success, after the communicator
// drained and MPI_Finalize).
int run_mpi_launched(const std::function<absl::StatusOr<std::unique_ptr<Communicator>>()>& make,
                     const std::function<absl::Status(Communicator&)>& fn);
// This process's place among the MPI_COMM_WORLD ranks on its host (MPI_COMM_TYPE_SHARED): its index there, and
// how many of them may run on its cores (their affinity masks overlap its own: all of them unless the launcher
// bound each to cores of its own). A collective over MPI_COMM_WORLD; MPI must be initialised.
struct HostPlacement {
  int local_rank = 0;
  int ranks_sharing_cores = 1;  // itself included
};
HostPlacement mpi_host_placement();

// run_mpi_launched with make_mpi_communicator.
int run_mpi_rank(const std::function<absl::Status(Communicator&)>& fn, CommOptions options = CommOptions::from_env());

}  // namespace zero
