// The mpi backend under a real mpirun (one ctest entry per world size): every collective, every dtype,
// awkward sizes, bit for bit against the same reference the local backend meets. Every rank runs every test.
#include "runtime/comm/mpi.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "runtime/allocator.h"
#include "runtime/cpu_threads.h"
#include "runtime/status.h"
#include "tests/runtime/collective_checks.h"

namespace zero {
namespace {

using testing::check_allgather;
using testing::check_allreduce;
using testing::check_allreduce_equals_reduce_scatter_then_allgather;
using testing::check_broadcast;
using testing::check_byte_counters;
using testing::check_gather;
using testing::check_in_place_allgather;
using testing::check_in_place_gather;
using testing::check_in_place_reduce_scatter;
using testing::check_in_place_scatter;
using testing::check_many_outstanding_collectives;
using testing::check_max_propagates_nan;
using testing::check_reduce;
using testing::check_reduce_scatter;
using testing::check_scatter;
using testing::kCheckSizes;
using testing::reductions_for;

Communicator* g_comm = nullptr;  // this process's rank, for the whole run
Communicator& comm() { return *g_comm; }

void expect_ok(const absl::Status& status) { EXPECT_TRUE(status.ok()) << status; }

class MpiCollectives : public ::testing::TestWithParam<DType> {
 protected:
  DType dtype() const { return GetParam(); }
  int n() const { return comm().world_size(); }
};

TEST_P(MpiCollectives, AllreduceMatchesTheRankOrderReference) {
  for (ReduceOp op : reductions_for(dtype())) {
    for (int64_t count : kCheckSizes) expect_ok(check_allreduce(comm(), dtype(), count, op));
  }
}

TEST_P(MpiCollectives, ReduceScatterGivesEachRankItsReducedChunk) {
  for (ReduceOp op : reductions_for(dtype())) {
    for (int64_t count : kCheckSizes) expect_ok(check_reduce_scatter(comm(), dtype(), count, op));
  }
}

TEST_P(MpiCollectives, InPlaceReduceScatterMatchesTheReference) {
  for (ReduceOp op : reductions_for(dtype())) {
    for (int64_t count : kCheckSizes) expect_ok(check_in_place_reduce_scatter(comm(), dtype(), count, op));
  }
}

TEST_P(MpiCollectives, ReduceLandsOnRootOnly) {
  for (ReduceOp op : reductions_for(dtype())) {
    for (int64_t count : kCheckSizes) expect_ok(check_reduce(comm(), dtype(), count, op, n() - 1));
  }
}

TEST_P(MpiCollectives, AllgatherConcatenatesInRankOrder) {
  for (int64_t count : kCheckSizes) expect_ok(check_allgather(comm(), dtype(), count));
}

TEST_P(MpiCollectives, InPlaceAllgatherConcatenatesInRankOrder) {
  for (int64_t count : kCheckSizes) expect_ok(check_in_place_allgather(comm(), dtype(), count));
}

TEST_P(MpiCollectives, GatherCollectsOnRoot) {
  for (int64_t count : kCheckSizes) expect_ok(check_gather(comm(), dtype(), count, n() / 2));
}

TEST_P(MpiCollectives, InPlaceGatherCollectsOnRoot) {
  for (int64_t count : kCheckSizes) expect_ok(check_in_place_gather(comm(), dtype(), count, n() / 2));
}

TEST_P(MpiCollectives, InPlaceScatterHandsOutRootChunks) {
  for (int64_t count : kCheckSizes) expect_ok(check_in_place_scatter(comm(), dtype(), count, n() - 1));
}

TEST_P(MpiCollectives, BroadcastCopiesRootEverywhere) {
  for (int64_t count : kCheckSizes) expect_ok(check_broadcast(comm(), dtype(), count, n() - 1));
}

TEST_P(MpiCollectives, ScatterHandsOutRootChunks) {
  for (int64_t count : kCheckSizes) expect_ok(check_scatter(comm(), dtype(), count, 0));
}

TEST_P(MpiCollectives, ManyOutstandingCollectivesCompleteInOrder) {
  expect_ok(check_many_outstanding_collectives(comm(), dtype(), 257));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MpiCollectives,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kU16,
                                           DType::kU8),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(MpiBackend, RankAndWorldSizeComeFromMpirun) {
  int rank = -1, size = -1;
  ASSERT_TRUE(absl::SimpleAtoi(std::getenv("OMPI_COMM_WORLD_RANK"), &rank)) << "run me under Open MPI's mpirun";
  ASSERT_TRUE(absl::SimpleAtoi(std::getenv("OMPI_COMM_WORLD_SIZE"), &size));
  EXPECT_EQ(comm().rank(), rank);
  EXPECT_EQ(comm().world_size(), size);
  EXPECT_EQ(comm().backend_name(), "mpi");
}

TEST(MpiBackend, AllreduceEqualsReduceScatterThenAllgatherBitForBit) {
  expect_ok(check_allreduce_equals_reduce_scatter_then_allgather(comm(), 1001));
}

TEST(MpiBackend, ByteCountersFollowTheRingFormulas) { expect_ok(check_byte_counters(comm())); }

TEST(MpiBackend, MaxPropagatesNaN) {
  if (comm().world_size() < 2) GTEST_SKIP() << "needs a peer";
  expect_ok(check_max_propagates_nan(comm()));
}

TEST(MpiBackend, ScratchIsAccountedAsCommBuffersAndReturned) {
  Allocator allocator(comm().rank());
  CommOptions options;
  options.allocator = &allocator;
  absl::StatusOr<std::unique_ptr<Communicator>> own = make_mpi_communicator(options);
  ASSERT_TRUE(own.ok()) << own.status();
  const int64_t n = comm().world_size();
  std::vector<float> in(n * 1000), out(1000);
  expect_ok((*own)
                ->reduce_scatter(Tensor(in.data(), DType::kF32, {n * 1000}), Tensor(out.data(), DType::kF32, {1000}),
                                 ReduceOp::kSum)
                .wait());
  // One 4000-byte chunk received from each rank, unless ZERO_MPI_PIECE_BYTES splits it into smaller pieces.
  const int64_t peak = allocator.stats().peak_of(MemoryCategory::kCommBuffers);
  if (std::getenv("ZERO_MPI_PIECE_BYTES") == nullptr) {
    EXPECT_EQ(peak, n * 4000);
  } else {
    EXPECT_GT(peak, 0);
  }
  EXPECT_EQ(allocator.stats().current_of(MemoryCategory::kCommBuffers), 0);
}

// Every rank on one host: distinct local ranks, and the ranks sharing this rank's cores are all of them where no rank
// is bound to cores of its own (the launcher's choice: Open MPI binds 1 or 2 ranks to a core each).
TEST(MpiHostPlacement, CountsTheRanksWhoseCoresOverlap) {
  const HostPlacement placement = mpi_host_placement();
  const int n = comm().world_size();
  const auto gathered = [&](int32_t mine) {
    std::vector<int32_t> all(n);
    expect_ok(comm().allgather(Tensor(&mine, DType::kI32, {1}), Tensor(all.data(), DType::kI32, {n})).wait());
    return all;
  };
  std::vector<int32_t> local_ranks = gathered(placement.local_rank);
  std::sort(local_ranks.begin(), local_ranks.end());
  for (int r = 0; r < n; ++r) EXPECT_EQ(local_ranks[r], r);
  EXPECT_GE(placement.ranks_sharing_cores, 1);
  EXPECT_LE(placement.ranks_sharing_cores, n);
  const bool unbound = available_cores() == static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const std::vector<int32_t> all_unbound = gathered(unbound ? 1 : 0);
  if (std::find(all_unbound.begin(), all_unbound.end(), 0) == all_unbound.end()) {
    EXPECT_EQ(placement.ranks_sharing_cores, n);
  }
}

// Ranks other than 0 print only their failures, each line prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }

 private:
  const int rank_;
};

}  // namespace
}  // namespace zero

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return zero::run_mpi_rank([](zero::Communicator& comm) -> absl::Status {
    zero::g_comm = &comm;
    if (comm.rank() != 0) {
      ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new zero::FailurePrinter(comm.rank()));
    }
    if (RUN_ALL_TESTS() != 0) return absl::InternalError("tests failed on this rank; see the failures above");
    return absl::OkStatus();
  });
}
