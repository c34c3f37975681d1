// Per-rank checks of every collective against the reference, shared by the suites of all backends.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/comm/communicator.h"

namespace zero::testing {

// Every rank calls the same check with the same arguments. Inputs are rank_data(dtype, ..., rank), so
// each rank knows every peer's input and computes the reference itself. A check returns the
// collective's own error, or InternalError naming the rank, the collective and the first element that
// differs from the reference bit for bit (results are compared as raw bytes, never with a tolerance).

// Awkward sizes (0, 1, primes, not multiples of any world size) every backend is run on.
inline constexpr int64_t kCheckSizes[] = {0, 1, 2, 7, 13, 64, 1009, 4099};
// The reductions `dtype` supports: sum and max for int32; sum, avg, max for the floating types; none else.
std::vector<ReduceOp> reductions_for(DType dtype);

absl::Status check_allreduce(Communicator& comm, DType dtype, int64_t count, ReduceOp op);
// count is the per-rank chunk; the input left alone.
absl::Status check_reduce_scatter(Communicator& comm, DType dtype, int64_t count, ReduceOp op);
// The reduction on root; every other rank's buffer left alone.
absl::Status check_reduce(Communicator& comm, DType dtype, int64_t count, ReduceOp op, int root);
absl::Status check_allgather(Communicator& comm, DType dtype, int64_t count);
absl::Status check_gather(Communicator& comm, DType dtype, int64_t count, int root);
absl::Status check_broadcast(Communicator& comm, DType dtype, int64_t count, int root);
absl::Status check_scatter(Communicator& comm, DType dtype, int64_t count, int root);

// The in-place forms: the chunk-sized buffer is this rank's chunk of the whole one (allgather and
// reduce_scatter on every rank, gather and scatter on root).
absl::Status check_in_place_allgather(Communicator& comm, DType dtype, int64_t count);
absl::Status check_in_place_reduce_scatter(Communicator& comm, DType dtype, int64_t count, ReduceOp op);
absl::Status check_in_place_gather(Communicator& comm, DType dtype, int64_t count, int root);
absl::Status check_in_place_scatter(Communicator& comm, DType dtype, int64_t count, int root);

// 16 broadcasts from rank 0 and a barrier issued before waiting for any: all complete, in order.
absl::Status check_many_outstanding_collectives(Communicator& comm, DType dtype, int64_t count);
// allreduce(sum) and reduce_scatter(sum) + allgather of the same fp32 input (world size x chunk) agree bit for bit.
absl::Status check_allreduce_equals_reduce_scatter_then_allgather(Communicator& comm, int64_t chunk);
// From reset counters, the byte counters after 2 allreduce, reduce_scatter, allgather and broadcast (fp32, chunk 250
// elements), against the ring formulas worked out by hand; then reset_stats zeroes them.
absl::Status check_byte_counters(Communicator& comm);
// max over [NaN on rank 1 else 1, 2] gives [NaN, 2]; needs at least 2 ranks.
absl::Status check_max_propagates_nan(Communicator& comm);

}  // namespace zero::testing
