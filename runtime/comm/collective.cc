#include "runtime/comm/collective.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zero {

absl::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

absl::string_view collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce: return "allreduce";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kAllgather: return "allgather";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kReduce: return "reduce";
    case CollectiveOp::kGather: return "gather";
    case CollectiveOp::kScatter: return "scatter";
    case CollectiveOp::kBarrier: return "barrier";
  }
  return "?";
}

bool is_reduction(CollectiveOp op) {
  return op == CollectiveOp::kAllreduce || op == CollectiveOp::kReduceScatter || op == CollectiveOp::kReduce;
}

std::string Collective::describe() const { return CollectiveFingerprint::of(*this).describe(); }

CollectiveFingerprint CollectiveFingerprint::of(const Collective& c) {
  const bool rooted = c.op == CollectiveOp::kBroadcast || c.op == CollectiveOp::kReduce ||
                      c.op == CollectiveOp::kGather || c.op == CollectiveOp::kScatter;
  return {.seq = c.seq,
          .count = c.count,
          .op = static_cast<int32_t>(c.op),
          .reduce_op = is_reduction(c.op) ? static_cast<int32_t>(c.reduce_op) : 0,
          .dtype = static_cast<int32_t>(c.dtype),
          .root = rooted ? c.root : 0};
}

std::string CollectiveFingerprint::describe() const {
  const auto op_enum = static_cast<CollectiveOp>(op);
  std::string s = absl::StrCat("#", seq, " ", collective_op_name(op_enum));
  if (op_enum == CollectiveOp::kBarrier) return s;
  absl::StrAppend(&s, "(", dtype_name(static_cast<DType>(dtype)), " x ", count);
  if (is_reduction(op_enum)) absl::StrAppend(&s, ", ", reduce_op_name(static_cast<ReduceOp>(reduce_op)));
  if (op_enum == CollectiveOp::kBroadcast || op_enum == CollectiveOp::kReduce || op_enum == CollectiveOp::kGather ||
      op_enum == CollectiveOp::kScatter) {
    absl::StrAppend(&s, ", root ", root);
  }
  return absl::StrCat(s, ")");
}

absl::Status check_fingerprints_agree(std::span<const CollectiveFingerprint> all) {
  // Group ranks by what they issued, in order of first appearance.
  std::vector<std::pair<CollectiveFingerprint, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == all[r]; });
    if (it == groups.end()) {
      groups.push_back({all[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  if (groups.size() <= 1) return absl::OkStatus();
  std::vector<std::string> parts;
  for (const auto& [fingerprint, ranks] : groups) {
    parts.push_back(absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "), " issued ",
                                 fingerprint.describe()));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("ranks diverged in their collective sequence: ", absl::StrJoin(parts, "; "),
                   ". Every rank must issue the same collectives in the same order with the same sizes."));
}

int64_t payload_bytes(const Collective& c, int world_size) {
  switch (c.op) {
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllgather:
    case CollectiveOp::kGather:
    case CollectiveOp::kScatter: return world_size * c.chunk_bytes();
    default: return c.op == CollectiveOp::kBarrier ? 0 : c.chunk_bytes();
  }
}

int64_t bytes_sent(const Collective& c, int rank, int world_size) {
  const int64_t n = world_size;
  const int64_t bytes = c.chunk_bytes();
  const bool is_root = rank == c.root;
  switch (c.op) {
    case CollectiveOp::kAllreduce: return 2 * (n - 1) * bytes / n;
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllgather: return (n - 1) * bytes;
    case CollectiveOp::kBroadcast:
    case CollectiveOp::kScatter: return is_root ? (n - 1) * bytes : 0;
    case CollectiveOp::kReduce:
    case CollectiveOp::kGather: return is_root ? 0 : bytes;
    case CollectiveOp::kBarrier: return 0;
  }
  return 0;
}

}  // namespace zero
