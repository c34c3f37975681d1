#include "tests/runtime/collective_checks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/status.h"
#include "tests/runtime/comm_test_util.h"

namespace zero::testing {
namespace {

using Bytes = std::vector<uint8_t>;

int64_t esize(DType dtype) { return static_cast<int64_t>(dtype_size(dtype)); }

Tensor tensor_of(Bytes& bytes, DType dtype) {
  return Tensor(bytes.data(), dtype, {static_cast<int64_t>(bytes.size()) / esize(dtype)});
}

// Every rank's input, indexed by rank.
std::vector<Bytes> all_inputs(const Communicator& comm, DType dtype, int64_t count, uint64_t seed = 1) {
  std::vector<Bytes> all;
  for (int r = 0; r < comm.world_size(); ++r) all.push_back(rank_data(dtype, count, r, seed));
  return all;
}

Bytes concat(const std::vector<Bytes>& parts) {
  Bytes all;
  for (const Bytes& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

// "allreduce(fp32 x 7, sum)", "gather(uint8 x 13, root 1)".
std::string what(absl::string_view op, DType dtype, int64_t count, absl::string_view detail = "") {
  return absl::StrCat(op, "(", dtype_name(dtype), " x ", count, detail.empty() ? "" : ", ", detail, ")");
}
std::string root_detail(int root) { return absl::StrCat("root ", root); }

std::string element_hex(const Bytes& bytes, int64_t element, DType dtype) {
  std::string s;
  for (int64_t b = 0; b < esize(dtype); ++b) absl::StrAppendFormat(&s, "%02x", bytes[element * esize(dtype) + b]);
  return s;
}

// OK when `got` equals `want` byte for byte; otherwise says how many elements differ and shows the first.
absl::Status expect_bytes(const Communicator& comm, absl::string_view context, DType dtype, const Bytes& got,
                          const Bytes& want) {
  if (got == want) return absl::OkStatus();
  if (got.size() != want.size()) {
    return absl::InternalError(
        absl::StrCat("rank ", comm.rank(), ": ", context, ": got ", got.size(), " bytes, want ", want.size()));
  }
  const int64_t n = static_cast<int64_t>(got.size()) / esize(dtype);
  int64_t first = -1, differing = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (element_hex(got, i, dtype) == element_hex(want, i, dtype)) continue;
    if (first < 0) first = i;
    ++differing;
  }
  return absl::InternalError(absl::StrCat("rank ", comm.rank(), ": ", context, ": ", differing, " of ", n,
                                          " elements differ from the reference; first at element ", first, ": got 0x",
                                          element_hex(got, first, dtype), ", want 0x", element_hex(want, first, dtype),
                                          " (bytes in memory order)"));
}

absl::Status expect_eq(const Communicator& comm, absl::string_view context, int64_t got, int64_t want) {
  if (got == want) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("rank ", comm.rank(), ": ", context, " is ", got, ", want ", want));
}

}  // namespace

std::vector<ReduceOp> reductions_for(DType dtype) {
  if (dtype == DType::kI32) return {ReduceOp::kSum, ReduceOp::kMax};
  if (is_floating(dtype)) return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
  return {};
}

absl::Status check_allreduce(Communicator& comm, DType dtype, int64_t count, ReduceOp op) {
  const auto in = all_inputs(comm, dtype, count);
  Bytes buf = in[comm.rank()];
  ZERO_RETURN_IF_ERROR(comm.allreduce(tensor_of(buf, dtype), op).wait());
  return expect_bytes(comm, what("allreduce", dtype, count, reduce_op_name(op)), dtype, buf,
                      reference_reduce(in, dtype, count, op));
}

absl::Status check_reduce_scatter(Communicator& comm, DType dtype, int64_t count, ReduceOp op) {
  const int n = comm.world_size();
  const auto in = all_inputs(comm, dtype, n * count);
  Bytes send = in[comm.rank()];
  Bytes recv(count * esize(dtype));
  ZERO_RETURN_IF_ERROR(comm.reduce_scatter(tensor_of(send, dtype), tensor_of(recv, dtype), op).wait());
  const std::string context = what("reduce_scatter", dtype, count, reduce_op_name(op));
  ZERO_RETURN_IF_ERROR(expect_bytes(comm, context, dtype, recv,
                                    chunk_of(reference_reduce(in, dtype, n * count, op), dtype, count, comm.rank())));
  return expect_bytes(comm, absl::StrCat(context, " must leave its input alone"), dtype, send, in[comm.rank()]);
}

absl::Status check_reduce(Communicator& comm, DType dtype, int64_t count, ReduceOp op, int root) {
  const auto in = all_inputs(comm, dtype, count);
  Bytes buf = in[comm.rank()];
  ZERO_RETURN_IF_ERROR(comm.reduce(tensor_of(buf, dtype), root, op).wait());
  const Bytes want = comm.rank() == root ? reference_reduce(in, dtype, count, op) : in[comm.rank()];
  return expect_bytes(comm, what("reduce", dtype, count, absl::StrCat(reduce_op_name(op), ", root ", root)), dtype, buf,
                      want);
}

absl::Status check_allgather(Communicator& comm, DType dtype, int64_t count) {
  const auto in = all_inputs(comm, dtype, count);
  Bytes send = in[comm.rank()];
  Bytes recv(comm.world_size() * count * esize(dtype));
  ZERO_RETURN_IF_ERROR(comm.allgather(tensor_of(send, dtype), tensor_of(recv, dtype)).wait());
  return expect_bytes(comm, what("allgather", dtype, count), dtype, recv, concat(in));
}

absl::Status check_gather(Communicator& comm, DType dtype, int64_t count, int root) {
  const auto in = all_inputs(comm, dtype, count);
  const bool is_root = comm.rank() == root;
  Bytes send = in[comm.rank()];
  Bytes recv(is_root ? comm.world_size() * count * esize(dtype) : 0);
  ZERO_RETURN_IF_ERROR(comm.gather(tensor_of(send, dtype), tensor_of(recv, dtype), root).wait());
  return is_root ? expect_bytes(comm, what("gather", dtype, count, root_detail(root)), dtype, recv, concat(in))
                 : absl::OkStatus();
}

absl::Status check_broadcast(Communicator& comm, DType dtype, int64_t count, int root) {
  const auto in = all_inputs(comm, dtype, count);
  Bytes buf = in[comm.rank()];
  ZERO_RETURN_IF_ERROR(comm.broadcast(tensor_of(buf, dtype), root).wait());
  return expect_bytes(comm, what("broadcast", dtype, count, root_detail(root)), dtype, buf, in[root]);
}

absl::Status check_scatter(Communicator& comm, DType dtype, int64_t count, int root) {
  const auto in = all_inputs(comm, dtype, comm.world_size() * count);
  Bytes send = comm.rank() == root ? in[root] : Bytes{};
  Bytes recv(count * esize(dtype));
  ZERO_RETURN_IF_ERROR(comm.scatter(tensor_of(send, dtype), tensor_of(recv, dtype), root).wait());
  return expect_bytes(comm, what("scatter", dtype, count, root_detail(root)), dtype, recv,
                      chunk_of(in[root], dtype, count, comm.rank()));
}

absl::Status check_in_place_allgather(Communicator& comm, DType dtype, int64_t count) {
  const auto in = all_inputs(comm, dtype, count);
  Bytes buf(comm.world_size() * count * esize(dtype));
  std::copy(in[comm.rank()].begin(), in[comm.rank()].end(), buf.begin() + comm.rank() * count * esize(dtype));
  Tensor whole = tensor_of(buf, dtype);
  ZERO_RETURN_IF_ERROR(comm.allgather(whole.slice(comm.rank() * count, (comm.rank() + 1) * count), whole).wait());
  return expect_bytes(comm, absl::StrCat("in-place ", what("allgather", dtype, count)), dtype, buf, concat(in));
}

absl::Status check_in_place_reduce_scatter(Communicator& comm, DType dtype, int64_t count, ReduceOp op) {
  const int n = comm.world_size();
  const auto in = all_inputs(comm, dtype, n * count);
  Bytes buf = in[comm.rank()];
  Tensor whole = tensor_of(buf, dtype);
  Tensor mine = whole.slice(comm.rank() * count, (comm.rank() + 1) * count);
  ZERO_RETURN_IF_ERROR(comm.reduce_scatter(whole, mine, op).wait());
  return expect_bytes(comm, absl::StrCat("in-place ", what("reduce_scatter", dtype, count, reduce_op_name(op))), dtype,
                      chunk_of(buf, dtype, count, comm.rank()),
                      chunk_of(reference_reduce(in, dtype, n * count, op), dtype, count, comm.rank()));
}

absl::Status check_in_place_gather(Communicator& comm, DType dtype, int64_t count, int root) {
  const auto in = all_inputs(comm, dtype, count);
  if (comm.rank() != root) {
    Bytes send = in[comm.rank()];
    return comm.gather(tensor_of(send, dtype), Tensor(nullptr, dtype, {0}), root).wait();
  }
  Bytes buf(comm.world_size() * count * esize(dtype));
  std::copy(in[root].begin(), in[root].end(), buf.begin() + root * count * esize(dtype));
  Tensor whole = tensor_of(buf, dtype);
  ZERO_RETURN_IF_ERROR(comm.gather(whole.slice(root * count, (root + 1) * count), whole, root).wait());
  return expect_bytes(comm, absl::StrCat("in-place ", what("gather", dtype, count, root_detail(root))), dtype, buf,
                      concat(in));
}

absl::Status check_in_place_scatter(Communicator& comm, DType dtype, int64_t count, int root) {
  const auto in = all_inputs(comm, dtype, comm.world_size() * count);
  Bytes buf = comm.rank() == root ? in[root] : Bytes(count * esize(dtype));
  Tensor whole = tensor_of(buf, dtype);
  Tensor mine = comm.rank() == root ? whole.slice(root * count, (root + 1) * count) : whole;
  ZERO_RETURN_IF_ERROR(comm.scatter(whole, mine, root).wait());
  const Bytes got = comm.rank() == root ? chunk_of(buf, dtype, count, root) : buf;
  return expect_bytes(comm, absl::StrCat("in-place ", what("scatter", dtype, count, root_detail(root))), dtype, got,
                      chunk_of(in[root], dtype, count, comm.rank()));
}

absl::Status check_many_outstanding_collectives(Communicator& comm, DType dtype, int64_t count) {
  const auto in = all_inputs(comm, dtype, count);
  std::vector<Bytes> bufs(16, in[comm.rank()]);
  std::vector<Work> works;
  for (Bytes& b : bufs) works.push_back(comm.broadcast(tensor_of(b, dtype), 0));
  works.push_back(comm.barrier());
  for (Work& w : works) ZERO_RETURN_IF_ERROR(w.wait());
  for (const Bytes& b : bufs) {
    ZERO_RETURN_IF_ERROR(
        expect_bytes(comm, absl::StrCat("one of 16 outstanding ", what("broadcast", dtype, count)), dtype, b, in[0]));
  }
  return absl::OkStatus();
}

absl::Status check_allreduce_equals_reduce_scatter_then_allgather(Communicator& comm, int64_t chunk) {
  const int n = comm.world_size();
  const auto in = all_inputs(comm, DType::kF32, n * chunk, /*seed=*/7);
  Bytes allreduced = in[comm.rank()];
  Bytes send = in[comm.rank()];
  Bytes shard(chunk * 4), gathered(n * chunk * 4);
  ZERO_RETURN_IF_ERROR(comm.allreduce(tensor_of(allreduced, DType::kF32), ReduceOp::kSum).wait());
  ZERO_RETURN_IF_ERROR(
      comm.reduce_scatter(tensor_of(send, DType::kF32), tensor_of(shard, DType::kF32), ReduceOp::kSum).wait());
  ZERO_RETURN_IF_ERROR(comm.allgather(tensor_of(shard, DType::kF32), tensor_of(gathered, DType::kF32)).wait());
  return expect_bytes(comm, "reduce_scatter + allgather against allreduce", DType::kF32, gathered, allreduced);
}

absl::Status check_byte_counters(Communicator& comm) {
  const int64_t n = comm.world_size();
  const int64_t bytes = n * 1000;  // the whole fp32 buffer: n chunks of 250 elements
  std::vector<float> buf(n * 250), shard(250), big(n * n * 250);
  Tensor t(buf.data(), DType::kF32, {n * 250});
  comm.reset_stats();  // counts from earlier work on a shared communicator
  ZERO_RETURN_IF_ERROR(comm.allreduce(t, ReduceOp::kSum).wait());
  ZERO_RETURN_IF_ERROR(comm.allreduce(t, ReduceOp::kSum).wait());
  ZERO_RETURN_IF_ERROR(comm.reduce_scatter(t, Tensor(shard.data(), DType::kF32, {250}), ReduceOp::kSum).wait());
  ZERO_RETURN_IF_ERROR(comm.allgather(t, Tensor(big.data(), DType::kF32, {n * n * 250})).wait());
  ZERO_RETURN_IF_ERROR(comm.broadcast(t, 0).wait());
  const CommStats s = comm.stats();
  const int64_t broadcast_sent = comm.rank() == 0 ? (n - 1) * bytes : 0;
  // Ring allreduce sends 2(N-1)/N of the buffer; reduce_scatter and allgather (N-1) chunks.
  for (const absl::Status& status : {
           expect_eq(comm, "allreduce calls", s.of(CollectiveOp::kAllreduce).calls, 2),
           expect_eq(comm, "allreduce payload bytes", s.of(CollectiveOp::kAllreduce).payload_bytes, 2 * bytes),
           expect_eq(comm, "allreduce sent bytes", s.of(CollectiveOp::kAllreduce).sent_bytes,
                     2 * (2 * (n - 1) * bytes / n)),
           expect_eq(comm, "reduce_scatter sent bytes", s.of(CollectiveOp::kReduceScatter).sent_bytes, (n - 1) * 1000),
           expect_eq(comm, "reduce_scatter payload bytes", s.of(CollectiveOp::kReduceScatter).payload_bytes, bytes),
           expect_eq(comm, "allgather sent bytes", s.of(CollectiveOp::kAllgather).sent_bytes, (n - 1) * bytes),
           expect_eq(comm, "allgather payload bytes", s.of(CollectiveOp::kAllgather).payload_bytes, n * bytes),
           expect_eq(comm, "broadcast sent bytes", s.of(CollectiveOp::kBroadcast).sent_bytes, broadcast_sent),
           expect_eq(comm, "total sent bytes", s.total_sent_bytes(),
                     4 * (n - 1) * 1000 + (n - 1) * 1000 + (n - 1) * bytes + broadcast_sent),
       }) {
    ZERO_RETURN_IF_ERROR(status);
  }
  comm.reset_stats();
  return expect_eq(comm, "total sent bytes after reset_stats", comm.stats().total_sent_bytes(), 0);
}

absl::Status check_max_propagates_nan(Communicator& comm) {
  if (comm.world_size() < 2) return absl::InvalidArgumentError("check_max_propagates_nan needs at least 2 ranks");
  std::vector<float> buf = {comm.rank() == 1 ? std::nanf("") : 1.0f, 2.0f};
  ZERO_RETURN_IF_ERROR(comm.allreduce(Tensor(buf.data(), DType::kF32, {2}), ReduceOp::kMax).wait());
  if (std::isnan(buf[0]) && buf[1] == 2.0f) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("rank ", comm.rank(), ": max over [NaN on rank 1, 1 elsewhere; 2] gave [",
                                          buf[0], ", ", buf[1], "], want [nan, 2]"));
}

}  // namespace zero::testing
