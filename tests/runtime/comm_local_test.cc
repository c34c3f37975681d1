// The local backend: every collective, N in {1,2,3,4,8}, every dtype, awkward sizes, and failures.
#include "runtime/comm/local.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "runtime/cpu_threads.h"
#include "runtime/device_memory.h"
#include "runtime/sim/sim_api.h"
#include "runtime/sim/sim_device.h"
#include "runtime/status.h"
#include "tests/runtime/collective_checks.h"
#include "tests/runtime/stream_hold.h"

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
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::kCheckSizes;
using testing::reductions_for;
using testing::StreamHold;

void expect_all_ok(const std::vector<absl::Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
}

// Runs `check` on every rank of a fresh group of `n` and expects it to pass everywhere.
void expect_passes(int n, const std::function<absl::Status(Communicator&)>& check) {
  expect_all_ok(run_local_ranks(n, check));
}

class LocalCollectives : public ::testing::TestWithParam<std::tuple<int, DType>> {
 protected:
  int n() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

TEST_P(LocalCollectives, AllreduceMatchesTheRankOrderReference) {
  for (ReduceOp op : reductions_for(dtype())) {
    for (int64_t count : kCheckSizes) {
      expect_passes(n(), [&](Communicator& comm) { return check_allreduce(comm, dtype(), count, op); });
    }
  }
}

TEST_P(LocalCollectives, ReduceScatterGivesEachRankItsReducedChunk) {
  for (ReduceOp op : reductions_for(dtype())) {
    for (int64_t count : kCheckSizes) {
      expect_passes(n(), [&](Communicator& comm) { return check_reduce_scatter(comm, dtype(), count, op); });
    }
  }
}

TEST_P(LocalCollectives, InPlaceReduceScatterMatchesTheReference) {
  for (ReduceOp op : reductions_for(dtype())) {
    for (int64_t count : kCheckSizes) {
      expect_passes(n(), [&](Communicator& comm) { return check_in_place_reduce_scatter(comm, dtype(), count, op); });
    }
  }
}

TEST_P(LocalCollectives, ReduceLandsOnRootOnly) {
  for (ReduceOp op : reductions_for(dtype())) {
    for (int64_t count : kCheckSizes) {
      expect_passes(n(), [&](Communicator& comm) { return check_reduce(comm, dtype(), count, op, n() - 1); });
    }
  }
}

TEST_P(LocalCollectives, AllgatherConcatenatesInRankOrder) {
  for (int64_t count : kCheckSizes) {
    expect_passes(n(), [&](Communicator& comm) { return check_allgather(comm, dtype(), count); });
  }
}

TEST_P(LocalCollectives, InPlaceAllgatherConcatenatesInRankOrder) {
  for (int64_t count : kCheckSizes) {
    expect_passes(n(), [&](Communicator& comm) { return check_in_place_allgather(comm, dtype(), count); });
  }
}

TEST_P(LocalCollectives, GatherCollectsOnRoot) {
  for (int64_t count : kCheckSizes) {
    expect_passes(n(), [&](Communicator& comm) { return check_gather(comm, dtype(), count, n() / 2); });
  }
}

TEST_P(LocalCollectives, InPlaceGatherCollectsOnRoot) {
  for (int64_t count : kCheckSizes) {
    expect_passes(n(), [&](Communicator& comm) { return check_in_place_gather(comm, dtype(), count, n() / 2); });
  }
}

TEST_P(LocalCollectives, InPlaceScatterHandsOutRootChunks) {
  for (int64_t count : kCheckSizes) {
    expect_passes(n(), [&](Communicator& comm) { return check_in_place_scatter(comm, dtype(), count, n() - 1); });
  }
}

TEST_P(LocalCollectives, BroadcastCopiesRootEverywhere) {
  for (int64_t count : kCheckSizes) {
    expect_passes(n(), [&](Communicator& comm) { return check_broadcast(comm, dtype(), count, n() - 1); });
  }
}

TEST_P(LocalCollectives, ScatterHandsOutRootChunks) {
  for (int64_t count : kCheckSizes) {
    expect_passes(n(), [&](Communicator& comm) { return check_scatter(comm, dtype(), count, 0); });
  }
}

TEST_P(LocalCollectives, ManyOutstandingCollectivesCompleteInOrder) {
  expect_passes(n(), [&](Communicator& comm) { return check_many_outstanding_collectives(comm, dtype(), 257); });
}

INSTANTIATE_TEST_SUITE_P(WorldSizesAndDtypes, LocalCollectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kI32,
                                                              DType::kU16, DType::kU8)),
                         [](const auto& info) {
                           return absl::StrCat("N", std::get<0>(info.param), "_", dtype_name(std::get<1>(info.param)));
                         });

TEST(LocalBackend, AllreduceEqualsReduceScatterThenAllgatherBitForBit) {
  expect_passes(3, [](Communicator& comm) { return check_allreduce_equals_reduce_scatter_then_allgather(comm, 1001); });
}

TEST(LocalBackend, ByteCountersFollowTheRingFormulas) { expect_passes(4, check_byte_counters); }

// Regression: a barrier used to return before the final meeting, so a fast rank could post its next
// collective while a peer was still comparing the barrier's fingerprints, and report a false divergence.
TEST(LocalBackend, BarrierThenCollectiveNeverLooksLikeDivergence) {
  expect_all_ok(run_local_ranks(2, [&](Communicator& comm) {
    float x = 1.0f;
    for (int i = 0; i < 2000; ++i) {
      ZERO_RETURN_IF_ERROR(comm.barrier().wait());
      ZERO_RETURN_IF_ERROR(comm.allreduce(Tensor(&x, DType::kF32, {1}), ReduceOp::kMax).wait());
    }
    return absl::OkStatus();
  }));
}

TEST(LocalBackend, MaxPropagatesNaN) { expect_passes(2, check_max_propagates_nan); }

// One rank's reductions are its own values, bit for bit: nothing to do in place, a copy out of place. A signaling NaN
// payload survives, which a widen-and-round pass would have made fp16's canonical 0x7e00.
TEST(LocalBackend, OneRanksReductionsLeaveItsValuesAsTheyAre) {
  const std::vector<uint16_t> values = {0x3c00, 0x7d01, 0x8001, 0xfbff};  // 1, a signaling NaN, -2^-24, -65504
  expect_all_ok(run_local_ranks(1, [&](Communicator& comm) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      std::vector<uint16_t> buffer = values, out(values.size(), 0);
      ZERO_RETURN_IF_ERROR(comm.allreduce(Tensor(buffer.data(), DType::kF16, {4}), op).wait());
      EXPECT_EQ(buffer, values) << reduce_op_name(op);
      ZERO_RETURN_IF_ERROR(
          comm.reduce_scatter(Tensor(buffer.data(), DType::kF16, {4}), Tensor(out.data(), DType::kF16, {4}), op)
              .wait());
      EXPECT_EQ(out, values) << reduce_op_name(op);
    }
    return absl::OkStatus();
  }));
}

// --- Failures: every rank ends with an error, never a hang ---

TEST(LocalFailures, RankThatThrowsMidCollectiveFailsEveryPeer) {
  std::latch others_issued(3);  // rank 2 throws once the others have issued the allreduce it never joins
  const auto statuses = run_local_ranks(
      4,
      [&](Communicator& comm) -> absl::Status {
        std::vector<float> buf(100, 1.0f);
        if (comm.rank() == 2) {
          others_issued.wait();
          throw std::runtime_error("simulated crash");
        }
        Work allreduce = comm.allreduce(Tensor(buf.data(), DType::kF32, {100}), ReduceOp::kSum);
        others_issued.count_down();
        return allreduce.wait();
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
  const auto statuses = run_local_ranks(
      3,
      [&](Communicator& comm) -> absl::Status {
        if (comm.rank() == 1) return absl::OkStatus();
        std::vector<float> buf(10);
        return comm.allreduce(Tensor(buf.data(), DType::kF32, {10}), ReduceOp::kSum).wait();
      },
      CommOptions{.timeout = absl::Seconds(60)});
  EXPECT_TRUE(statuses[1].ok());
  for (int r : {0, 2}) {
    EXPECT_TRUE(absl::IsAborted(statuses[r])) << "at once, not DeadlineExceeded at the 60 s timeout: " << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()),
                HasSubstr("rank 1 finished its work without joining #0 allreduce(fp32 x 10, sum)"));
  }
}

TEST(LocalFailures, RankThatStopsAnsweringTimesOutOnEveryPeer) {
  // After one allreduce rank 3 stops answering until every peer has given up on the next. The timeout
  // also bounds the first allreduce, which all four threads must reach in time, whatever the load.
  std::latch peers_gave_up(3);
  const auto statuses = run_local_ranks(
      4,
      [&](Communicator& comm) -> absl::Status {
        std::vector<float> buf(10);
        Tensor t(buf.data(), DType::kF32, {10});
        absl::Status status = comm.allreduce(t, ReduceOp::kSum).wait();
        if (comm.rank() == 3) peers_gave_up.wait();
        if (status.ok()) status = comm.allreduce(t, ReduceOp::kSum).wait();
        if (comm.rank() != 3) peers_gave_up.count_down();
        return status;
      },
      CommOptions{.timeout = absl::Seconds(5)});
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

TEST(LocalFailures, BuffersOnDifferentDevicesAreRefusedBeforeAnyMemoryIsTouched) {
  // Rank 1 labels its host buffer sim:0 (never dereferenced: the check comes first).
  const auto statuses = run_local_ranks(2, [&](Communicator& comm) -> absl::Status {
    std::vector<float> buf(4, 1.0f);
    const Tensor t(buf.data(), DType::kF32, {4}, comm.rank() == 1 ? Device::sim(0) : Device::cpu());
    absl::Status s = comm.allreduce(t, ReduceOp::kSum).wait();
    for (float v : buf) EXPECT_EQ(v, 1.0f);
    return s;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(statuses[r])) << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()), HasSubstr("all must be on the host or all on one GPU"));
  }
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

TEST(LocalValidation, FewerThanOneRankIsAnInvalidArgumentNotACrash) {
  for (int world_size : {0, -2}) {
    bool ran = false;
    const std::vector<absl::Status> statuses = run_local_ranks(world_size, [&](Communicator&) {
      ran = true;
      return absl::OkStatus();
    });
    ASSERT_EQ(statuses.size(), 1u);
    EXPECT_TRUE(absl::IsInvalidArgument(statuses[0]));
    EXPECT_EQ(statuses[0].message(), absl::StrCat("local ranks: at least one rank is needed, got ", world_size));
    EXPECT_EQ(root_cause(statuses), statuses[0]);
    EXPECT_FALSE(ran);
  }
}

// Every rank thread gets its share of the cores, so ranks sharing a host do not oversubscribe it.
TEST(LocalRanks, EachRankThreadGetsItsShareOfTheCores) {
  unsetenv("OMP_NUM_THREADS");  // read by OpenMP at start only; now it says the user chose no count
  for (int world_size : {1, 2, 3, 5}) {
    std::vector<int> threads(world_size);
    const absl::Status status = root_cause(run_local_ranks(world_size, [&](Communicator& comm) {
      threads[comm.rank()] = cpu_threads();
      return absl::OkStatus();
    }));
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(threads, std::vector<int>(world_size, std::max(1, available_cores() / world_size)))
        << world_size << " ranks on " << available_cores() << " cores";
  }
}

// An OMP_NUM_THREADS caps each rank's share: a lower count is kept, a larger one (an exported nproc) does not
// oversubscribe, and one that is not a count is ignored.
TEST(LocalRanks, AnOmpNumThreadsCapsEachRanksShare) {
  const auto one_rank_threads = [](const char* omp_num_threads) {
    setenv("OMP_NUM_THREADS", omp_num_threads, /*overwrite=*/1);
    int threads = 0;
    EXPECT_TRUE(root_cause(run_local_ranks(1, [&](Communicator&) {
                  threads = cpu_threads();
                  return absl::OkStatus();
                })).ok());
    return threads;
  };
  EXPECT_EQ(one_rank_threads("1"), 1);
  EXPECT_EQ(one_rank_threads("100000"), available_cores());
  EXPECT_EQ(one_rank_threads("lots"), available_cores());
  unsetenv("OMP_NUM_THREADS");
}

// Queues on the calling thread's current stream a kernel writing `value` into fp32 `t` on the simulated device.
absl::Status fill_on_sim(const Tensor& t, float value) {
  return launch_on_sim(t.device(), "fill", {writes(t)}, [t, value](HostTensors& host) {
    const Tensor on_host = host(t);
    if (on_host.data() != nullptr) std::fill_n(on_host.data_as<float>(), t.numel(), value);
    return absl::OkStatus();  // HostTensors reports a failed lookup
  });
}

// `n` floats of sim:0, allocated on the calling thread's current stream.
absl::StatusOr<Tensor> sim_floats(int64_t n) {
  ZERO_ASSIGN_OR_RETURN(void* data, device_alloc(Device::sim(0), n * sizeof(float)));
  return Tensor(data, DType::kF32, {n}, Device::sim(0));
}

std::vector<float> read_floats(const Tensor& t) {
  std::vector<float> host(t.numel());
  const absl::Status copied = copy_bytes(host.data(), Device::cpu(), t.data(), t.device(), t.nbytes());
  EXPECT_TRUE(copied.ok()) << copied;
  return host;
}

// `fn` on two local ranks, each with a non-blocking stream of its own on sim:0 made current (so its memory, kernels
// and copies go there), waited for after `fn`.
std::vector<absl::Status> run_two_ranks_on_own_streams(const std::function<absl::Status(Communicator&)>& fn) {
  return run_local_ranks(2, [&](Communicator& comm) -> absl::Status {
    ZERO_ASSIGN_OR_RETURN(OwnedStream stream, OwnedStream::create(sim_device(), 0));
    const StreamScope on_stream(Device::sim(0), stream.get());
    absl::Status status = fn(comm);
    status.Update(sim_device().synchronize(stream.get()));
    return status;
  });
}

// Each rank writes its input with a kernel on its own stream, posts an allreduce, waits for its Work and reads the
// sum with the next kernel there: the post event and the Work's completion event are the only orders between the
// ranks' streams and the legacy stream the local backend works on (the checker fails the run on any other), and
// the rank's thread never waits for the device before its readback.
TEST(LocalOnDevice, CollectivesAreOrderedWithThePostersStreamsByEvents) {
  constexpr int64_t kCount = 64;
  const auto statuses = run_two_ranks_on_own_streams([&](Communicator& comm) -> absl::Status {
    ZERO_ASSIGN_OR_RETURN(const Tensor in, sim_floats(kCount));
    ZERO_ASSIGN_OR_RETURN(const Tensor out, sim_floats(kCount));
    const uint64_t waits_before = sim_device().host_synchronizations();
    ZERO_RETURN_IF_ERROR(fill_on_sim(in, static_cast<float>(comm.rank() + 1)));
    ZERO_RETURN_IF_ERROR(comm.allreduce(in, ReduceOp::kSum).wait());
    ZERO_RETURN_IF_ERROR(launch_on_sim(in.device(), "copy", {reads(in), writes(out)}, [&](HostTensors& host) {
      std::copy_n(host(in).data_as<float>(), kCount, host(out).data_as<float>());
      return absl::OkStatus();
    }));
    EXPECT_EQ(sim_device().host_synchronizations(), waits_before) << "rank " << comm.rank() << " waited";
    EXPECT_EQ(read_floats(out), std::vector<float>(kCount, 3.0f)) << "rank " << comm.rank();
    device_free(in.device(), in.data());
    device_free(out.device(), out.data());
    return absl::OkStatus();
  });
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

// The comm threads queue the local backend's device work and do not wait for it: with the device's legacy stream
// (where that work runs) held, both ranks' allreduces complete on the host, and the sums arrive once it is let go.
TEST(LocalOnDevice, CollectivesCompleteOnTheHostWhileTheirDeviceWorkIsHeld) {
  constexpr int64_t kCount = 64;
  auto hold = std::make_unique<StreamHold>(sim_device(), Stream::legacy(0));
  ASSERT_TRUE(hold->launched().ok()) << hold->launched();
  std::atomic<int> completed = 0;
  absl::Notification both_completed;
  std::vector<absl::Status> statuses;
  std::thread ranks([&] {
    statuses = run_two_ranks_on_own_streams([&](Communicator& comm) -> absl::Status {
      ZERO_ASSIGN_OR_RETURN(const Tensor in, sim_floats(kCount));
      ZERO_RETURN_IF_ERROR(fill_on_sim(in, static_cast<float>(comm.rank() + 1)));
      ZERO_RETURN_IF_ERROR(comm.allreduce(in, ReduceOp::kSum).wait());
      if (++completed == 2) both_completed.Notify();
      EXPECT_EQ(read_floats(in), std::vector<float>(kCount, 3.0f)) << "rank " << comm.rank();
      device_free(in.device(), in.data());
      return absl::OkStatus();
    });
  });
  // A guard against a hang only: the collectives need nothing from the device to complete.
  EXPECT_TRUE(both_completed.WaitForNotificationWithTimeout(absl::Seconds(60)))
      << "a rank's Work waited for the held device";
  hold.reset();
  ranks.join();
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

// A gather whose root queues rank 0's copy and then fails on rank 1's chunk (freed before the post): the root's Work
// fails, and still orders its stream after the copy it queued, so the root's free of its output there is clean (the
// checker would name it otherwise, the copy on the legacy stream still writing it).
TEST(LocalOnDevice, AFailedCollectiveOrdersTheWaitersStreamAfterWhatItQueued) {
  constexpr int64_t kCount = 64;
  const auto statuses = run_two_ranks_on_own_streams([&](Communicator& comm) -> absl::Status {
    ZERO_ASSIGN_OR_RETURN(const Tensor in, sim_floats(kCount));
    ZERO_ASSIGN_OR_RETURN(const Tensor out, sim_floats(2 * kCount));
    ZERO_RETURN_IF_ERROR(fill_on_sim(in, 0.0f));
    if (comm.rank() == 1) device_free(in.device(), in.data());  // the root's copy of it fails
    const absl::Status gathered = comm.gather(in, comm.rank() == 0 ? out : Tensor(), /*root=*/0).wait();
    if (comm.rank() == 0) device_free(in.device(), in.data());
    device_free(out.device(), out.data());
    return gathered;
  });
  EXPECT_THAT(std::string(statuses[0].message()), HasSubstr("not inside one live allocation"));
  EXPECT_TRUE(absl::IsAborted(statuses[1])) << statuses[1];
  EXPECT_TRUE(sim_device().synchronize_device(0).ok()) << "the checker found an unordered free";
}

// A world of one rank on the simulated device whose device collectives queue nothing: the settling tests' backends.
class OneRankOnSim : public Backend {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  bool supports(Device device) const override { return device.is_sim(); }
  absl::Status run(const Collective&, absl::Time) override { return absl::OkStatus(); }
};

// Its first collective, settled only once the test lets it, fails then: as an NCCL collective whose peer died fails
// after it was queued.
class FailsSettlingBackend final : public OneRankOnSim {
 public:
  absl::string_view name() const override { return "fails-settling"; }
  absl::Status settle(const Collective& c, Event, absl::Time) override {
    if (c.seq != 0) return absl::OkStatus();
    if (!let_settle.WaitForNotificationWithTimeout(absl::Seconds(60))) {  // a guard: the test lets it at once
      return absl::DeadlineExceededError("the test never let the first collective settle");
    }
    absl::SleepFor(absl::Milliseconds(50));  // long enough that a flush not waiting for the watchdog returns first
    return absl::UnavailableError(absl::StrCat(c.describe(), " stalled"));
  }
  void abort(const absl::Status&) override { aborted.Notify(); }

  absl::Notification let_settle;
  absl::Notification aborted;
};

// A device collective's Work completes once it is queued, before it is settled; what settling it finds aborts the
// backend and fails the collectives started after, and flush() returns it where none follows.
TEST(DeviceCollectives, CompleteOnceQueuedAndAFailureFoundSettlingOneFailsWhatFollows) {
  std::vector<float> buffer(4);  // labelled sim:0, never touched
  const Tensor t(buffer.data(), DType::kF32, {4}, Device::sim(0));
  for (const bool another_follows : {true, false}) {
    auto owned = std::make_unique<FailsSettlingBackend>();
    FailsSettlingBackend& backend = *owned;
    Communicator comm(std::move(owned), CommOptions{});
    EXPECT_TRUE(comm.allreduce(t, ReduceOp::kSum).wait().ok());  // the settling waits for the test
    EXPECT_FALSE(backend.aborted.HasBeenNotified());
    backend.let_settle.Notify();
    if (another_follows) {  // posted once the failure was found: a collective already running may still pass
      EXPECT_TRUE(backend.aborted.WaitForNotificationWithTimeout(absl::Seconds(60)));
    }
    const absl::Status reported = another_follows ? comm.allreduce(t, ReduceOp::kSum).wait() : comm.flush();
    EXPECT_TRUE(absl::IsUnavailable(reported)) << reported;
    EXPECT_THAT(std::string(reported.message()), HasSubstr("#0 allreduce(fp32 x 4, sum) stalled"));
    EXPECT_TRUE(backend.aborted.HasBeenNotified());
  }
}

// Its first collective settles only once the second has run: it stands for NCCL's, settled on the watchdog while
// the comm thread queues the next, and asks the device about each one's end event, as NCCL's settle polls it.
// Records the order of runs and settles.
class SettlesAfterTheNextRunsBackend final : public OneRankOnSim {
 public:
  absl::string_view name() const override { return "settles-after-the-next-runs"; }
  absl::Status run(const Collective& c, absl::Time) override {
    note(absl::StrCat("run #", c.seq));
    if (c.seq == 1) second_ran.Notify();
    return absl::OkStatus();
  }
  absl::Status settle(const Collective& c, Event end, absl::Time) override {
    // A guard against a hang only: with the settle on the comm thread, the second never runs.
    if (c.seq == 0 && !second_ran.WaitForNotificationWithTimeout(absl::Seconds(60))) {
      return absl::DeadlineExceededError("the second collective did not run while the first was settling");
    }
    note(absl::StrCat("settle #", c.seq));
    return sim_device().query(end).status();  // fails for an event already destroyed
  }
  std::vector<std::string> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }

  absl::Notification second_ran;

 private:
  void note(std::string event) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
  absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

// Settling a device collective does not hold the comm thread: the next one runs (is queued on the device) while the
// first is still being settled, and the settles follow the posting order. The first's Work is dropped at once: its
// end event lives on for the settle.
TEST(DeviceCollectives, TheNextRunsWhileOneIsSettling) {
  std::vector<float> buffer(4);  // labelled sim:0, never touched
  const Tensor t(buffer.data(), DType::kF32, {4}, Device::sim(0));
  auto owned = std::make_unique<SettlesAfterTheNextRunsBackend>();
  SettlesAfterTheNextRunsBackend& backend = *owned;
  Communicator comm(std::move(owned), CommOptions{});
  (void)comm.allreduce(t, ReduceOp::kSum);
  const Work second = comm.allreduce(t, ReduceOp::kSum);
  EXPECT_TRUE(second.wait().ok());
  EXPECT_TRUE(comm.flush().ok()) << comm.flush();
  EXPECT_THAT(backend.events(), ElementsAre("run #0", "run #1", "settle #0", "settle #1"));
}

}  // namespace
}  // namespace zero
