// The local backend: every collective, N in {1,2,3,4,8}, every dtype, awkward sizes, and failures.
#include "runtime/comm/local.h"

#include <chrono>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/status.h"
#include "tests/runtime/comm_test_util.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using testing::chunk_of;
using testing::rank_data;
using testing::reference_reduce;

constexpr int64_t kSizes[] = {0, 1, 2, 7, 13, 64, 1009, 4099};

Tensor tensor_of(std::vector<uint8_t>& bytes, DType dtype) {
  return Tensor(bytes.data(), dtype, {static_cast<int64_t>(bytes.size() / dtype_size(dtype))});
}

std::vector<ReduceOp> reductions_for(DType dtype) {
  if (dtype == DType::kI32) return {ReduceOp::kSum, ReduceOp::kMax};
  if (is_floating(dtype)) return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
  return {};
}

void expect_all_ok(const std::vector<absl::Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
}

class LocalCollectives : public ::testing::TestWithParam<std::tuple<int, DType>> {
 protected:
  int n() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  // Each rank's input for a run, indexed by rank.
  std::vector<std::vector<uint8_t>> inputs(int64_t count) const {
    std::vector<std::vector<uint8_t>> all;
    for (int r = 0; r < n(); ++r) all.push_back(rank_data(dtype(), count, r));
    return all;
  }
};

TEST_P(LocalCollectives, AllreduceMatchesTheRankOrderReference) {
  for (ReduceOp op : reductions_for(dtype())) {
    for (int64_t count : kSizes) {
      const auto in = inputs(count);
      const auto expected = reference_reduce(in, dtype(), count, op);
      expect_all_ok(run_local_ranks(n(), [&](Communicator& comm) {
        std::vector<uint8_t> buf = in[comm.rank()];
        absl::Status s = comm.allreduce(tensor_of(buf, dtype()), op).wait();
        EXPECT_EQ(buf, expected) << reduce_op_name(op) << " count " << count << " rank " << comm.rank();
        return s;
      }));
    }
  }
}

TEST_P(LocalCollectives, ReduceScatterGivesEachRankItsReducedChunk) {
  for (ReduceOp op : reductions_for(dtype())) {
    for (int64_t count : kSizes) {
      const auto in = inputs(n() * count);
      const auto reduced = reference_reduce(in, dtype(), n() * count, op);
      expect_all_ok(run_local_ranks(n(), [&](Communicator& comm) {
        std::vector<uint8_t> send = in[comm.rank()];
        std::vector<uint8_t> recv(count * dtype_size(dtype()));
        absl::Status s = comm.reduce_scatter(tensor_of(send, dtype()), tensor_of(recv, dtype()), op).wait();
        EXPECT_EQ(recv, chunk_of(reduced, dtype(), count, comm.rank())) << "count " << count;
        EXPECT_EQ(send, in[comm.rank()]) << "input must be left alone";
        return s;
      }));
    }
  }
}

TEST_P(LocalCollectives, ReduceLandsOnRootOnly) {
  for (ReduceOp op : reductions_for(dtype())) {
    for (int64_t count : kSizes) {
      const int root = n() - 1;
      const auto in = inputs(count);
      const auto expected = reference_reduce(in, dtype(), count, op);
      expect_all_ok(run_local_ranks(n(), [&](Communicator& comm) {
        std::vector<uint8_t> buf = in[comm.rank()];
        absl::Status s = comm.reduce(tensor_of(buf, dtype()), root, op).wait();
        EXPECT_EQ(buf, comm.rank() == root ? expected : in[comm.rank()]) << "count " << count;
        return s;
      }));
    }
  }
}

TEST_P(LocalCollectives, AllgatherConcatenatesInRankOrder) {
  for (int64_t count : kSizes) {
    const auto in = inputs(count);
    std::vector<uint8_t> expected;
    for (const auto& v : in) expected.insert(expected.end(), v.begin(), v.end());
    expect_all_ok(run_local_ranks(n(), [&](Communicator& comm) {
      std::vector<uint8_t> send = in[comm.rank()];
      std::vector<uint8_t> recv(expected.size());
      absl::Status s = comm.allgather(tensor_of(send, dtype()), tensor_of(recv, dtype())).wait();
      EXPECT_EQ(recv, expected) << "count " << count;
      return s;
    }));
  }
}

TEST_P(LocalCollectives, GatherCollectsOnRoot) {
  for (int64_t count : kSizes) {
    const int root = n() / 2;
    const auto in = inputs(count);
    std::vector<uint8_t> expected;
    for (const auto& v : in) expected.insert(expected.end(), v.begin(), v.end());
    expect_all_ok(run_local_ranks(n(), [&](Communicator& comm) {
      std::vector<uint8_t> send = in[comm.rank()];
      std::vector<uint8_t> recv(comm.rank() == root ? expected.size() : 0);
      absl::Status s = comm.gather(tensor_of(send, dtype()), tensor_of(recv, dtype()), root).wait();
      if (comm.rank() == root) {
        EXPECT_EQ(recv, expected) << "count " << count;
      }
      return s;
    }));
  }
}

TEST_P(LocalCollectives, BroadcastCopiesRootEverywhere) {
  for (int64_t count : kSizes) {
    const int root = n() - 1;
    const auto in = inputs(count);
    expect_all_ok(run_local_ranks(n(), [&](Communicator& comm) {
      std::vector<uint8_t> buf = in[comm.rank()];
      absl::Status s = comm.broadcast(tensor_of(buf, dtype()), root).wait();
      EXPECT_EQ(buf, in[root]) << "count " << count;
      return s;
    }));
  }
}

TEST_P(LocalCollectives, ScatterHandsOutRootChunks) {
  for (int64_t count : kSizes) {
    const int root = 0;
    const auto in = inputs(n() * count);
    expect_all_ok(run_local_ranks(n(), [&](Communicator& comm) {
      std::vector<uint8_t> send = comm.rank() == root ? in[root] : std::vector<uint8_t>{};
      std::vector<uint8_t> recv(count * dtype_size(dtype()));
      absl::Status s = comm.scatter(tensor_of(send, dtype()), tensor_of(recv, dtype()), root).wait();
      EXPECT_EQ(recv, chunk_of(in[root], dtype(), count, comm.rank())) << "count " << count;
      return s;
    }));
  }
}

TEST_P(LocalCollectives, ManyOutstandingCollectivesCompleteInOrder) {
  const auto in = inputs(257);
  expect_all_ok(run_local_ranks(n(), [&](Communicator& comm) {
    std::vector<std::vector<uint8_t>> bufs(16, in[comm.rank()]);
    std::vector<Work> works;
    for (auto& b : bufs) works.push_back(comm.broadcast(tensor_of(b, dtype()), 0));
    works.push_back(comm.barrier());
    for (Work& w : works) ZERO_RETURN_IF_ERROR(w.wait());
    for (auto& b : bufs) EXPECT_EQ(b, in[0]);
    return absl::OkStatus();
  }));
}

INSTANTIATE_TEST_SUITE_P(WorldSizesAndDtypes, LocalCollectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kI32,
                                                              DType::kU16, DType::kU8)),
                         [](const auto& info) {
                           return absl::StrCat("N", std::get<0>(info.param), "_",
                                               dtype_name(std::get<1>(info.param)));
                         });

TEST(LocalBackend, AllreduceEqualsReduceScatterThenAllgatherBitForBit) {
  constexpr int kRanks = 3;
  constexpr int64_t kChunk = 1001;
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < kRanks; ++r) in.push_back(rank_data(DType::kF32, kRanks * kChunk, r, /*seed=*/7));
  expect_all_ok(run_local_ranks(kRanks, [&](Communicator& comm) {
    std::vector<uint8_t> allreduced = in[comm.rank()];
    std::vector<uint8_t> send = in[comm.rank()];
    std::vector<uint8_t> shard(kChunk * 4), gathered(kRanks * kChunk * 4);
    ZERO_RETURN_IF_ERROR(comm.allreduce(tensor_of(allreduced, DType::kF32), ReduceOp::kSum).wait());
    ZERO_RETURN_IF_ERROR(
        comm.reduce_scatter(tensor_of(send, DType::kF32), tensor_of(shard, DType::kF32), ReduceOp::kSum).wait());
    ZERO_RETURN_IF_ERROR(comm.allgather(tensor_of(shard, DType::kF32), tensor_of(gathered, DType::kF32)).wait());
    EXPECT_EQ(gathered, allreduced);
    return absl::OkStatus();
  }));
}

TEST(LocalBackend, ByteCountersFollowTheRingFormulas) {
  constexpr int kRanks = 4;
  expect_all_ok(run_local_ranks(kRanks, [&](Communicator& comm) {
    std::vector<float> buf(1000), shard(250), big(4000);
    Tensor t(buf.data(), DType::kF32, {1000});
    ZERO_RETURN_IF_ERROR(comm.allreduce(t, ReduceOp::kSum).wait());
    ZERO_RETURN_IF_ERROR(comm.allreduce(t, ReduceOp::kSum).wait());
    ZERO_RETURN_IF_ERROR(comm.reduce_scatter(t, Tensor(shard.data(), DType::kF32, {250}), ReduceOp::kSum).wait());
    ZERO_RETURN_IF_ERROR(comm.allgather(t, Tensor(big.data(), DType::kF32, {4000})).wait());
    ZERO_RETURN_IF_ERROR(comm.broadcast(t, 0).wait());
    const CommStats s = comm.stats();
    EXPECT_EQ(s.of(CollectiveOp::kAllreduce).calls, 2);
    EXPECT_EQ(s.of(CollectiveOp::kAllreduce).payload_bytes, 8000);
    EXPECT_EQ(s.of(CollectiveOp::kAllreduce).sent_bytes, 2 * (2 * 3 * 4000 / 4));
    EXPECT_EQ(s.of(CollectiveOp::kReduceScatter).sent_bytes, 3 * 1000);
    EXPECT_EQ(s.of(CollectiveOp::kReduceScatter).payload_bytes, 4000);
    EXPECT_EQ(s.of(CollectiveOp::kAllgather).sent_bytes, 3 * 4000);
    EXPECT_EQ(s.of(CollectiveOp::kAllgather).payload_bytes, 16000);
    EXPECT_EQ(s.of(CollectiveOp::kBroadcast).sent_bytes, comm.rank() == 0 ? 3 * 4000 : 0);
    EXPECT_EQ(s.total_sent_bytes(), 12000 + 3000 + 12000 + (comm.rank() == 0 ? 12000 : 0));
    comm.reset_stats();
    EXPECT_EQ(comm.stats().total_sent_bytes(), 0);
    return absl::OkStatus();
  }));
}

TEST(LocalBackend, MaxPropagatesNaN) {
  expect_all_ok(run_local_ranks(2, [&](Communicator& comm) {
    std::vector<float> buf = {comm.rank() == 1 ? std::nanf("") : 1.0f, 2.0f};
    ZERO_RETURN_IF_ERROR(comm.allreduce(Tensor(buf.data(), DType::kF32, {2}), ReduceOp::kMax).wait());
    EXPECT_TRUE(std::isnan(buf[0]));
    EXPECT_EQ(buf[1], 2.0f);
    return absl::OkStatus();
  }));
}

// --- Failures: every rank ends with an error, never a hang ---

CommOptions short_timeout() {
  CommOptions options;
  options.timeout = absl::Seconds(2);
  return options;
}

TEST(LocalFailures, RankThatThrowsMidCollectiveFailsEveryPeer) {
  const auto statuses = run_local_ranks(
      4,
      [&](Communicator& comm) -> absl::Status {
        std::vector<float> buf(100, 1.0f);
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the others are inside the allreduce
          throw std::runtime_error("simulated crash");
        }
        return comm.allreduce(Tensor(buf.data(), DType::kF32, {100}), ReduceOp::kSum).wait();
      },
      CommOptions{.timeout = absl::Seconds(60)});
  for (int r : {0, 1, 3}) {
    EXPECT_TRUE(absl::IsAborted(statuses[r])) << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()), HasSubstr("rank 2 failed: rank 2 threw: simulated crash"));
  }
  EXPECT_THAT(std::string(root_cause(statuses).message()), HasSubstr("rank 2 threw: simulated crash"));
}

TEST(LocalFailures, RankThatReturnsAnErrorFailsEveryPeer) {
  const auto statuses = run_local_ranks(3, [&](Communicator& comm) -> absl::Status {
    if (comm.rank() == 0) return absl::DataLossError("checkpoint is truncated");
    ZERO_RETURN_IF_ERROR(comm.barrier().wait());
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsDataLoss(root_cause(statuses)));
  for (int r : {1, 2}) EXPECT_THAT(std::string(statuses[r].message()), HasSubstr("checkpoint is truncated"));
}

TEST(LocalFailures, RankThatExitsEarlyFailsPeersAtOnce) {
  const absl::Time start = absl::Now();
  const auto statuses = run_local_ranks(
      3,
      [&](Communicator& comm) -> absl::Status {
        if (comm.rank() == 1) return absl::OkStatus();
        std::vector<float> buf(10);
        return comm.allreduce(Tensor(buf.data(), DType::kF32, {10}), ReduceOp::kSum).wait();
      },
      CommOptions{.timeout = absl::Seconds(60)});
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // not the 60 s timeout
  EXPECT_TRUE(statuses[1].ok());
  for (int r : {0, 2}) {
    EXPECT_THAT(std::string(statuses[r].message()),
                HasSubstr("rank 1 finished its work without joining #0 allreduce(fp32 x 10, sum)"));
  }
}

TEST(LocalFailures, RankThatStopsAnsweringTimesOutOnEveryPeer) {
  const absl::Time start = absl::Now();
  const auto statuses = run_local_ranks(
      4,
      [&](Communicator& comm) -> absl::Status {
        std::vector<float> buf(10);
        Tensor t(buf.data(), DType::kF32, {10});
        ZERO_RETURN_IF_ERROR(comm.allreduce(t, ReduceOp::kSum).wait());
        if (comm.rank() == 3) std::this_thread::sleep_for(std::chrono::seconds(4));  // hangs past the timeout
        return comm.allreduce(t, ReduceOp::kSum).wait();
      },
      short_timeout());
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_TRUE(absl::IsDeadlineExceeded(root_cause(statuses))) << root_cause(statuses);
  EXPECT_THAT(std::string(root_cause(statuses).message()),
              HasSubstr("timed out in #1 allreduce(fp32 x 10, sum) waiting for rank 3"));
  for (int r = 0; r < 4; ++r) EXPECT_FALSE(statuses[r].ok()) << "rank " << r;
}

TEST(LocalFailures, DivergingCollectivesNameTheRanks) {
  const auto statuses = run_local_ranks(3, [&](Communicator& comm) -> absl::Status {
    std::vector<float> buf(12), out(36);
    Tensor t(buf.data(), DType::kF32, {12});
    if (comm.rank() == 1) return comm.allgather(t, Tensor(out.data(), DType::kF32, {36})).wait();
    return comm.allreduce(t, ReduceOp::kSum).wait();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsFailedPrecondition(statuses[r])) << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()),
                HasSubstr("ranks 0, 2 issued #0 allreduce(fp32 x 12, sum); rank 1 issued #0 allgather(fp32 x 12)"));
  }
}

TEST(LocalFailures, DivergingCountsAreCaughtBeforeAnyMemoryIsTouched) {
  const auto statuses = run_local_ranks(2, [&](Communicator& comm) -> absl::Status {
    std::vector<float> buf(comm.rank() == 0 ? 8 : 4, 1.0f);
    Tensor t(buf.data(), DType::kF32, {static_cast<int64_t>(buf.size())});
    absl::Status s = comm.allreduce(t, ReduceOp::kSum).wait();
    for (float v : buf) EXPECT_EQ(v, 1.0f);
    return s;
  });
  EXPECT_THAT(std::string(statuses[0].message()), HasSubstr("rank 0 issued #0 allreduce(fp32 x 8, sum)"));
  EXPECT_THAT(std::string(statuses[0].message()), HasSubstr("rank 1 issued #0 allreduce(fp32 x 4, sum)"));
}

TEST(LocalFailures, DebugModeChecksTheSequenceBeforeEachCollective) {
  CommOptions options{.timeout = absl::Seconds(60), .debug_collectives = true};
  const auto statuses = run_local_ranks(
      2,
      [&](Communicator& comm) -> absl::Status {
        std::vector<float> buf(4);
        Tensor t(buf.data(), DType::kF32, {4});
        ZERO_RETURN_IF_ERROR(comm.allreduce(t, ReduceOp::kSum).wait());
        return comm.broadcast(t, /*root=*/comm.rank()).wait();  // roots disagree
      },
      options);
  EXPECT_THAT(std::string(statuses[0].message()),
              HasSubstr("rank 0 issued #1 broadcast(fp32 x 4, root 0); rank 1 issued #1 broadcast(fp32 x 4, root 1)"));
}

TEST(LocalFailures, FailureIsStickyForLaterCalls) {
  const auto statuses = run_local_ranks(2, [&](Communicator& comm) -> absl::Status {
    std::vector<float> buf(comm.rank() + 1);
    Tensor t(buf.data(), DType::kF32, {comm.rank() + 1});
    const absl::Status first = comm.allreduce(t, ReduceOp::kSum).wait();
    EXPECT_FALSE(first.ok());
    const absl::Status later = comm.barrier().wait();
    EXPECT_EQ(later, first);
    return later;
  });
  EXPECT_FALSE(statuses[0].ok());
}

TEST(LocalValidation, RejectsBadArgumentsWithoutCommunicating) {
  expect_all_ok(run_local_ranks(2, [&](Communicator& comm) {
    std::vector<float> in(7), out(3);
    std::vector<uint8_t> bytes(4);
    std::vector<int32_t> ints(4);
    const auto message = [](const Work& w) { return std::string(w.wait().message()); };
    EXPECT_THAT(message(comm.reduce_scatter(Tensor(in.data(), DType::kF32, {7}), Tensor(out.data(), DType::kF32, {3}),
                                            ReduceOp::kSum)),
                HasSubstr("must hold world size 2 x 3 (one chunk per rank); pad it to a multiple"));
    EXPECT_THAT(message(comm.broadcast(Tensor(in.data(), DType::kF32, {7}), 2)), HasSubstr("root 2 is not a rank"));
    EXPECT_THAT(message(comm.allreduce(Tensor(bytes.data(), DType::kU8, {4}), ReduceOp::kSum)),
                HasSubstr("cannot reduce uint8"));
    EXPECT_THAT(message(comm.allreduce(Tensor(ints.data(), DType::kI32, {4}), ReduceOp::kAvg)),
                HasSubstr("avg of int32 is not defined"));
    EXPECT_THAT(message(comm.allreduce(Tensor(in.data(), DType::kF32, {2, 3}, {1, 2}, Device::cpu()), ReduceOp::kSum)),
                HasSubstr("is not contiguous"));
    EXPECT_THAT(message(comm.allgather(Tensor(in.data(), DType::kF32, {3}), Tensor(bytes.data(), DType::kU8, {6}))),
                HasSubstr("differ in dtype or device"));
    // Nothing was issued, so the sequence is still aligned and a real collective works.
    return comm.barrier().wait();
  }));
}

}  // namespace
}  // namespace zero
