// The local backend with several ranks on one GPU agrees bit for bit with the same ranks on the CPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/allocator.h"
#include "runtime/comm/local.h"
#include "runtime/status.h"
#include "tests/runtime/comm_test_util.h"
#include "tests/skip_without_gpu.h"

namespace zero {
namespace {

using testing::rank_data;
using testing::reference_reduce;

constexpr int kWorld = 3;
constexpr int64_t kCount = 1009;  // per-rank chunk; prime, so no split across ranks is even
constexpr int kRoot = 1;

struct Case {
  CollectiveOp op;
  DType dtype;
  ReduceOp reduce_op = ReduceOp::kSum;
};

// Elements of the input and of the output buffer (0 for in-place ops) each rank holds for `op`.
std::pair<int64_t, int64_t> buffer_elements(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kScatter: return {kWorld * kCount, kCount};
    case CollectiveOp::kAllgather:
    case CollectiveOp::kGather: return {kCount, kWorld * kCount};
    default: return {kCount, 0};
  }
}

Work issue(Communicator& comm, const Case& c, Tensor in, Tensor out) {
  switch (c.op) {
    case CollectiveOp::kAllreduce: return comm.allreduce(in, c.reduce_op);
    case CollectiveOp::kReduceScatter: return comm.reduce_scatter(in, out, c.reduce_op);
    case CollectiveOp::kReduce: return comm.reduce(in, kRoot, c.reduce_op);
    case CollectiveOp::kAllgather: return comm.allgather(in, out);
    case CollectiveOp::kGather: return comm.gather(in, out, kRoot);
    case CollectiveOp::kBroadcast: return comm.broadcast(in, kRoot);
    case CollectiveOp::kScatter: return comm.scatter(in, out, kRoot);
    case CollectiveOp::kBarrier: return comm.barrier();
  }
  return Work::completed(absl::InternalError("unknown op"));
}

// Runs `c` on kWorld local ranks with buffers on `device`; returns each rank's result bytes (the output
// buffer, or the in-place buffer).
std::vector<std::vector<uint8_t>> run_case(Device device, const Case& c) {
  const auto [in_elems, out_elems] = buffer_elements(c.op);
  const size_t esize = dtype_size(c.dtype);
  std::vector<std::vector<uint8_t>> results(kWorld);
  const absl::Status status = root_cause(run_local_ranks(kWorld, [&](Communicator& comm) -> absl::Status {
    Allocator allocator(comm.rank());
    ZERO_ASSIGN_OR_RETURN(Buffer in, allocator.allocate(in_elems * esize, MemoryCategory::kCommBuffers, device));
    ZERO_ASSIGN_OR_RETURN(Buffer out, allocator.allocate(out_elems * esize, MemoryCategory::kCommBuffers, device));
    const std::vector<uint8_t> data = rank_data(c.dtype, in_elems, comm.rank());
    if (cudaMemcpy(in.data(), data.data(), data.size(), cudaMemcpyDefault) != cudaSuccess) {
      return absl::InternalError("copy in failed");
    }
    const std::vector<uint8_t> zeros(out.nbytes());  // cudaMemset would refuse the CPU case's host memory
    if (out_elems > 0 && cudaMemcpy(out.data(), zeros.data(), zeros.size(), cudaMemcpyDefault) != cudaSuccess) {
      return absl::InternalError("clearing the output failed");
    }
    ZERO_RETURN_IF_ERROR(issue(comm, c, in.tensor(c.dtype, {in_elems}), out.tensor(c.dtype, {out_elems})).wait());
    const Buffer& result = out_elems > 0 ? out : in;
    results[comm.rank()].resize(result.nbytes());
    if (cudaMemcpy(results[comm.rank()].data(), result.data(), result.nbytes(), cudaMemcpyDefault) != cudaSuccess) {
      return absl::InternalError("copy out failed");
    }
    return absl::OkStatus();
  }));
  EXPECT_TRUE(status.ok()) << status;
  return results;
}

std::vector<ReduceOp> reductions_for(DType dtype) {
  if (dtype == DType::kI32) return {ReduceOp::kSum, ReduceOp::kMax};
  return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
}

TEST(CommLocalCudaTest, ReductionsOnOneGpuEqualTheCpuBitForBit) {
  ZERO_SKIP_WITHOUT_GPU();
  for (CollectiveOp op : {CollectiveOp::kAllreduce, CollectiveOp::kReduceScatter, CollectiveOp::kReduce}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
      for (ReduceOp reduce_op : reductions_for(dtype)) {
        const Case c{op, dtype, reduce_op};
        SCOPED_TRACE(absl::StrCat(collective_op_name(op), " ", dtype_name(dtype), " ", reduce_op_name(reduce_op)));
        EXPECT_EQ(run_case(Device::cuda(0), c), run_case(Device::cpu(), c));
      }
    }
  }
}

TEST(CommLocalCudaTest, AllreduceOnOneGpuEqualsTheReference) {
  ZERO_SKIP_WITHOUT_GPU();
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < kWorld; ++r) inputs.push_back(rank_data(DType::kBF16, kCount, r));
  const std::vector<uint8_t> expected = reference_reduce(inputs, DType::kBF16, kCount, ReduceOp::kAvg);
  for (const auto& result : run_case(Device::cuda(0), {CollectiveOp::kAllreduce, DType::kBF16, ReduceOp::kAvg})) {
    EXPECT_EQ(result, expected);
  }
}

TEST(CommLocalCudaTest, DataMovementOnOneGpuEqualsTheCpuBitForBit) {
  ZERO_SKIP_WITHOUT_GPU();
  for (CollectiveOp op :
       {CollectiveOp::kAllgather, CollectiveOp::kBroadcast, CollectiveOp::kGather, CollectiveOp::kScatter}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kU8}) {
      SCOPED_TRACE(absl::StrCat(collective_op_name(op), " ", dtype_name(dtype)));
      EXPECT_EQ(run_case(Device::cuda(0), {op, dtype}), run_case(Device::cpu(), {op, dtype}));
    }
  }
}

}  // namespace
}  // namespace zero
