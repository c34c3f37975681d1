// What one collective call is: op, reduction, dtype, sizes, buffers, root and its place in the sequence.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace zero {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax };

enum class CollectiveOp : uint8_t {
  kAllreduce,
  kReduceScatter,
  kAllgather,
  kBroadcast,
  kReduce,
  kGather,
  kScatter,
  kBarrier,
};
inline constexpr int kNumCollectiveOps = 8;

absl::string_view reduce_op_name(ReduceOp op);
absl::string_view collective_op_name(CollectiveOp op);
bool is_reduction(CollectiveOp op);

// Buffers per op (n = count, N = world size):
//   allreduce       recv (n), in place (send == recv)
//   reduce_scatter  send (N*n) -> recv (n): rank r gets the reduction of every rank's chunk r
//   allgather       send (n) -> recv (N*n): chunk r of recv is rank r's send
//   broadcast       recv (n), root's contents copied to every rank
//   reduce          recv (n), in place; the reduction lands on root only
//   gather          send (n) -> recv (N*n) on root; recv unused elsewhere
//   scatter         send (N*n) on root -> recv (n); send unused elsewhere
//   barrier         no buffers
struct Collective {
  CollectiveOp op = CollectiveOp::kBarrier;
  ReduceOp reduce_op = ReduceOp::kSum;
  DType dtype = DType::kU8;
  Device device = Device::cpu();
  int64_t count = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  int root = 0;
  uint64_t seq = 0;  // position in this communicator's sequence, from 0

  int64_t chunk_bytes() const { return count * static_cast<int64_t>(dtype_size(dtype)); }
  // "#7 allreduce(fp32 x 1024, sum)"
  std::string describe() const;
};

// The part of a collective every rank must agree on; compared across ranks to catch divergence.
struct CollectiveFingerprint {
  uint64_t seq = 0;
  int64_t count = 0;
  int32_t op = 0;
  int32_t reduce_op = 0;
  int32_t dtype = 0;
  int32_t root = 0;

  static CollectiveFingerprint of(const Collective& c);
  bool operator==(const CollectiveFingerprint&) const = default;
  std::string describe() const;
};

// Elements [begin, end) of `count` that rank r reduces in an allreduce: balanced for any count, the
// same split in every backend.
inline std::pair<int64_t, int64_t> chunk_range(int64_t count, int rank, int world_size) {
  return {count * rank / world_size, count * (rank + 1) / world_size};
}

// OK when every rank's fingerprint is the same; otherwise FailedPrecondition naming each group of ranks
// and what it issued, e.g. "ranks 0, 2 issued #7 allreduce(fp32 x 1024, sum); rank 1 issued #7 allgather(...)".
absl::Status check_fingerprints_agree(std::span<const CollectiveFingerprint> all);

// Bytes of the whole buffer a collective moves: N*count for reduce_scatter, allgather, gather and
// scatter, count otherwise. nccl-tests' "size": algorithm bandwidth is this over the time taken.
int64_t payload_bytes(const Collective& c, int world_size);

// Bytes this rank sends for `c` under the bandwidth-optimal algorithm, as nccl-tests counts them:
// ring allreduce 2(N-1)/N of the buffer, ring reduce_scatter/allgather (N-1) chunks; the rooted ops
// count a direct algorithm (broadcast/scatter: root sends N-1 copies; reduce/gather: each non-root sends once).
int64_t bytes_sent(const Collective& c, int rank, int world_size);

}  // namespace zero
