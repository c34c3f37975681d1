// The nccl backend: one rank per GPU, set up through the TCP store. GPU tests skip without a GPU.
#include "runtime/comm/nccl.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/allocator.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/status.h"
#include "tests/runtime/comm_test_util.h"
#include "tests/runtime/stream_hold.h"
#include "tests/skip_without_gpu.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using testing::rank_data;
using testing::reference_reduce;

constexpr int64_t kCount = 1009;

// Runs fn on `world` threads, rank r on cuda:r, each with an nccl communicator.
std::vector<absl::Status> run_nccl_ranks(int world, const std::function<absl::Status(Communicator&)>& fn,
                                         bool debug_collectives = false) {
  CommOptions options;
  options.timeout = absl::Seconds(120);
  options.debug_collectives = debug_collectives;
  return run_nccl_ranks_in_process(world, fn, options);
}

// Rank `rank`'s input on its GPU, and the result copied back after `issue` ran on it in place.
absl::StatusOr<std::vector<uint8_t>> in_place_on_gpu(Communicator& comm, DType dtype, int64_t elements,
                                                     const std::function<Work(Tensor)>& issue) {
  Allocator allocator(comm.rank());
  const std::vector<uint8_t> data = rank_data(dtype, elements, comm.rank());
  ZERO_ASSIGN_OR_RETURN(Buffer buffer, allocator.allocate(static_cast<int64_t>(data.size()),
                                                          MemoryCategory::kCommBuffers, Device::cuda(comm.rank())));
  if (cudaMemcpy(buffer.data(), data.data(), data.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
    return absl::InternalError("copy in failed");
  }
  ZERO_RETURN_IF_ERROR(issue(buffer.tensor(dtype, {elements})).wait());
  std::vector<uint8_t> result(data.size());
  if (cudaMemcpy(result.data(), buffer.data(), data.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
    return absl::InternalError("copy out failed");
  }
  return result;
}

// Unit roundoff of the type NCCL accumulates in.
double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return std::ldexp(1.0, -8);
    case DType::kF16: return std::ldexp(1.0, -11);
    default: return std::ldexp(1.0, -24);
  }
}

// NCCL's allreduce against the rank-order reference. Max and int32 sum are exact (max does not round;
// wrapping integer addition is associative). A floating sum of N terms in any order, each partial sum
// rounded with unit roundoff at most u (that of the dtype), is off the exact sum by at most (N-1)·u·Σ|x|.
// Both sides are such sums; NCCL's avg adds one rounding (premultiply or divide), the reference's avg
// one division and one final rounding to the dtype: |nccl - reference| <= (2N+1)·u·Σ|x| (Σ|x|/N for avg).
absl::Status check_allreduce_against_reference(Communicator& comm, DType dtype, ReduceOp op) {
  const int n = comm.world_size();
  ZERO_ASSIGN_OR_RETURN(const std::vector<uint8_t> got,
                        in_place_on_gpu(comm, dtype, kCount, [&](Tensor t) { return comm.allreduce(t, op); }));
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(rank_data(dtype, kCount, r));
  const std::vector<uint8_t> expected = reference_reduce(inputs, dtype, kCount, op);
  if (dtype == DType::kI32 || op == ReduceOp::kMax || n == 1) {
    if (got == expected) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("rank ", comm.rank(), ": not bitwise equal to the reference"));
  }
  for (int64_t i = 0; i < kCount; ++i) {
    double magnitude = 0;
    for (const auto& in : inputs) magnitude += std::fabs(load_as_float(in.data(), dtype, i));
    if (op == ReduceOp::kAvg) magnitude /= n;
    const double tolerance = (2 * n + 1) * unit_roundoff(dtype) * magnitude;
    const double diff = std::fabs(load_as_float(got.data(), dtype, i) - load_as_float(expected.data(), dtype, i));
    if (diff > tolerance) {
      return absl::InternalError(
          absl::StrCat("rank ", comm.rank(), " element ", i, ": off by ", diff, ", more than ", tolerance));
    }
  }
  return absl::OkStatus();
}

// Each rank's chunk r gathered everywhere: exact, since nothing is computed.
absl::Status check_allgather_exact(Communicator& comm, DType dtype) {
  const int n = comm.world_size();
  Allocator allocator(comm.rank());
  const Device device = Device::cuda(comm.rank());
  const std::vector<uint8_t> mine = rank_data(dtype, kCount, comm.rank());
  ZERO_ASSIGN_OR_RETURN(Buffer in, allocator.allocate(mine.size(), MemoryCategory::kCommBuffers, device));
  ZERO_ASSIGN_OR_RETURN(Buffer out, allocator.allocate(n * mine.size(), MemoryCategory::kCommBuffers, device));
  if (cudaMemcpy(in.data(), mine.data(), mine.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
    return absl::InternalError("copy in failed");
  }
  ZERO_RETURN_IF_ERROR(comm.allgather(in.tensor(dtype, {kCount}), out.tensor(dtype, {n * kCount})).wait());
  std::vector<uint8_t> got(out.nbytes());
  if (cudaMemcpy(got.data(), out.data(), got.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
    return absl::InternalError("copy out failed");
  }
  std::vector<uint8_t> expected;
  for (int r = 0; r < n; ++r) {
    const std::vector<uint8_t> theirs = rank_data(dtype, kCount, r);
    expected.insert(expected.end(), theirs.begin(), theirs.end());
  }
  return got == expected ? absl::OkStatus() : absl::InternalError("allgather is not bitwise exact");
}

absl::Status check_every_collective(Communicator& comm) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      if (dtype == DType::kI32 && op == ReduceOp::kAvg) continue;
      ZERO_RETURN_IF_ERROR(check_allreduce_against_reference(comm, dtype, op));
    }
    ZERO_RETURN_IF_ERROR(check_allgather_exact(comm, dtype));
  }
  ZERO_ASSIGN_OR_RETURN(const std::vector<uint8_t> broadcast,
                        in_place_on_gpu(comm, DType::kU8, kCount, [&](Tensor t) { return comm.broadcast(t, 0); }));
  if (broadcast != rank_data(DType::kU8, kCount, 0)) return absl::InternalError("broadcast is not rank 0's bytes");
  return comm.barrier().wait();
}

TEST(CommNcclTest, WithoutAGpuSetupFailsNamingTheDevice) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is visible";
  auto comm = make_nccl_communicator(DistributedEnv{.master_port = 0});
  EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
  EXPECT_THAT(comm.status().message(), HasSubstr("wants cuda:0 but 0 CUDA device(s) are visible"));
}

TEST(CommNcclTest, WorldOfOneMatchesTheReferenceExactly) {
  ZERO_SKIP_WITHOUT_GPU();
  for (const absl::Status& s : run_nccl_ranks(1, check_every_collective)) EXPECT_TRUE(s.ok()) << s;
}

TEST(CommNcclTest, OneRankPerVisibleGpuMatchesTheReferenceUpToReductionOrder) {
  const int gpus = cuda_device_count();
  if (gpus < 2) GTEST_SKIP() << "needs at least 2 CUDA devices, " << gpus << " visible";
  for (const absl::Status& s : run_nccl_ranks(gpus, check_every_collective)) EXPECT_TRUE(s.ok()) << s;
}

TEST(CommNcclTest, DebugCheckStagesFingerprintsThroughTheGpu) {
  ZERO_SKIP_WITHOUT_GPU();
  const auto statuses = run_nccl_ranks(
      1,
      [](Communicator& comm) -> absl::Status {
        if (!comm.options().debug_collectives.value_or(false)) return absl::InternalError("debug mode was not on");
        return check_every_collective(comm);
      },
      /*debug_collectives=*/true);
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

TEST(CommNcclTest, HostBuffersAreStagedThroughTheGpu) {
  ZERO_SKIP_WITHOUT_GPU();
  for (const absl::Status& s : run_nccl_ranks(1, [](Communicator& comm) -> absl::Status {
         float sums[4] = {1.5f, -2.0f, 3.0f, 4.25f};
         ZERO_RETURN_IF_ERROR(comm.allreduce(Tensor(sums, DType::kF32, {4}), ReduceOp::kSum).wait());
         int32_t mine[2] = {7, -9}, all[2] = {};
         ZERO_RETURN_IF_ERROR(comm.allgather(Tensor(mine, DType::kI32, {2}), Tensor(all, DType::kI32, {2})).wait());
         if (sums[0] != 1.5f || sums[3] != 4.25f || all[0] != 7 || all[1] != -9) {
           return absl::InternalError("a world of one changed the staged values");
         }
         return absl::OkStatus();
       })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(CommNcclTest, ACollectiveReadsWhatTheKernelsEnqueuedBeforeItsPostWrote) {
  ZERO_SKIP_WITHOUT_GPU();
  for (const absl::Status& s : run_nccl_ranks(1, [](Communicator& comm) -> absl::Status {
         Allocator allocator(comm.rank());
         ZERO_ASSIGN_OR_RETURN(Buffer input,
                               allocator.allocate(4096, MemoryCategory::kCommBuffers, comm.home_device()));
         ZERO_ASSIGN_OR_RETURN(Buffer output,
                               allocator.allocate(4096, MemoryCategory::kCommBuffers, comm.home_device()));
         ZERO_CUDA_RETURN_IF_ERROR(cudaMemset(input.data(), 0, 4096));
         ZERO_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
         // The input is written on the default stream, where the kernels run, held until the allgather is
         // posted; NCCL's stream runs beside it, so without the ordering at post the allgather would copy the
         // zeros.
         testing::StreamHold hold(cuda_api(), Stream::legacy(comm.home_device().index));
         ZERO_RETURN_IF_ERROR(hold.launched());
         ZERO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(input.data(), 0x33, 4096, cudaStreamLegacy));
         Work allgather = comm.allgather(Tensor(input.data(), DType::kU8, {4096}, comm.home_device()),
                                         Tensor(output.data(), DType::kU8, {4096}, comm.home_device()));
         hold.release();
         ZERO_RETURN_IF_ERROR(allgather.wait());
         std::vector<uint8_t> host(4096);
         ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), output.data(), 4096, cudaMemcpyDeviceToHost));
         if (host != std::vector<uint8_t>(4096, 0x33)) {
           return absl::InternalError("the allgather read its input before the default stream wrote it");
         }
         return absl::OkStatus();
       })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

}  // namespace
}  // namespace zero
