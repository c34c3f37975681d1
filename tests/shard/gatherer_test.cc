// ParamGatherer on its own (planned and recorded passes, prefetch within max_live_units, the allgather
// after an update), and the engine's evaluation and full-parameter visits sending exactly the planned gathers.
#include "shard/gatherer.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/local.h"
#include "runtime/status.h"
#include "shard/engine.h"
#include "tests/shard/toy_model.h"
#include "tests/shard/toy_training.h"

namespace zero {
namespace {

constexpr int kRanks = 2;
constexpr int kMaxLive = 2;

// One rank's units of the toy model (input, hidden_0, hidden_1, head tied to input) at `stage`, every unit
// sharded at stage 3. Rank r fills the params it holds with values that say which element of which rank.
struct RankUnits {
  RankUnits(Communicator& comm, int stage)
      : model(testing::ToyConfig{}), allocator(comm.rank()), meter(comm, Device::cpu(), /*time_phases=*/false) {
    units = *flat_unit_states(model.units(), StagePolicy(stage), /*persistence_threshold=*/0, comm.rank(),
                              comm.world_size());
    for (UnitState& u : units) {
      u.params = *allocator.allocate(u.held_numel * 4, MemoryCategory::kParams);
      float* held = static_cast<float*>(u.params.data());
      for (int64_t k = 0; k < u.held_numel; ++k) held[k] = value(comm.rank(), u.held_begin + k);
    }
    gatherer = std::make_unique<ParamGatherer>(RankContext{units, comm, allocator, meter, DType::kF32, Device::cpu()},
                                               kMaxLive);
  }
  static float value(int rank, int64_t element) { return static_cast<float>(1000 * (rank + 1) + element); }

  testing::ToyModel model;
  Allocator allocator;
  CommMeter meter;
  std::vector<UnitState> units;
  std::unique_ptr<ParamGatherer> gatherer;
};

int64_t gather_bytes(const std::vector<UnitState>& units, const std::vector<int>& gathers) {
  int64_t bytes = 0;  // each allgather sends this rank's slice to the N - 1 others
  for (const int i : gathers) bytes += (kRanks - 1) * units[i].layout.shard_numel * 4;
  return bytes;
}

// The most gathered bytes alive when `order` is acquired and released one unit at a time with prefetch
// along it: each unit beside the next max_live_units - 1.
int64_t prefetched_peak(const std::vector<UnitState>& units, const std::vector<int>& order) {
  int64_t peak = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    int64_t live = 0;
    for (size_t j = k; j < order.size() && j < k + kMaxLive; ++j) live += units[order[j]].layout.padded_numel * 4;
    peak = std::max(peak, live);
  }
  return peak;
}

int64_t comm_buffers_peak(const Allocator& allocator) {
  return allocator.stats().peak[static_cast<int>(MemoryCategory::kCommBuffers)];
}

// Acquires and releases `order` one unit at a time, checking each gathered copy holds every rank's slice.
absl::Status walk(RankUnits& r, const std::vector<int>& order) {
  for (const int i : order) {
    const int unit[] = {i};
    ZERO_RETURN_IF_ERROR(r.gatherer->acquire(unit));
    const Tensor full = r.gatherer->full_params(i);
    const UnitState& u = r.units[i];
    for (int64_t k = 0; k < u.layout.padded_numel; ++k) {
      const int owner = static_cast<int>(k / u.layout.shard_numel);
      if (full.data_as<float>()[k] != RankUnits::value(owner, k)) {
        return absl::InternalError(absl::StrCat("unit ", i, " element ", k, " was not gathered from rank ", owner));
      }
    }
    r.gatherer->release(unit);
  }
  return absl::OkStatus();
}

// One pass over `order`, measured from zero: a recorded one (a training step's), or one planned as `order`.
absl::Status pass(RankUnits& r, const std::vector<int>& order, bool recorded) {
  r.meter.reset_volume();
  r.allocator.reset_peaks();
  if (recorded) {
    r.gatherer->begin_recorded_pass();
  } else {
    r.gatherer->begin_planned_pass(order);
  }
  ZERO_RETURN_IF_ERROR(walk(r, order));
  return r.gatherer->end_pass();
}
absl::Status recorded_pass(RankUnits& r, const std::vector<int>& order) { return pass(r, order, true); }
absl::Status planned_pass(RankUnits& r, const std::vector<int>& plan) { return pass(r, plan, false); }

void expect_all_ok(const std::vector<absl::Status>& statuses) {
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

TEST(ParamGatherer, PlannedPassSendsExactlyThePlannedGathersWithAtMostMaxLiveCopies) {
  expect_all_ok(run_local_ranks(kRanks, [](Communicator& comm) -> absl::Status {
    RankUnits r(comm, 3);
    const std::vector<int> plan = {0, 1, 2, 3};
    ZERO_RETURN_IF_ERROR(planned_pass(r, plan));
    EXPECT_EQ(r.meter.volume().param_gather, gather_bytes(r.units, plan));
    EXPECT_EQ(comm_buffers_peak(r.allocator), prefetched_peak(r.units, plan));
    EXPECT_EQ(r.allocator.stats().current[static_cast<int>(MemoryCategory::kCommBuffers)], 0);
    return absl::OkStatus();
  }));
}

TEST(ParamGatherer, FirstRecordedPassGathersOnDemandAndTheNextPrefetchesAlongTheRecord) {
  expect_all_ok(run_local_ranks(kRanks, [](Communicator& comm) -> absl::Status {
    RankUnits r(comm, 3);
    const std::vector<int> order = {0, 1, 2, 3};
    ZERO_RETURN_IF_ERROR(recorded_pass(r, order));
    int64_t largest = 0;
    for (const UnitState& u : r.units) largest = std::max(largest, u.layout.padded_numel * 4);
    EXPECT_EQ(comm_buffers_peak(r.allocator), largest) << "no record yet: one copy at a time, no prefetch";

    ZERO_RETURN_IF_ERROR(recorded_pass(r, order));
    EXPECT_EQ(comm_buffers_peak(r.allocator), prefetched_peak(r.units, order));
    EXPECT_EQ(r.meter.volume().param_gather, gather_bytes(r.units, order)) << "prefetch gathers nothing extra";
    return absl::OkStatus();
  }));
}

TEST(ParamGatherer, PassThatLeavesTheRecordStopsPrefetchingAndIsRecordedInstead) {
  expect_all_ok(run_local_ranks(kRanks, [](Communicator& comm) -> absl::Status {
    RankUnits r(comm, 3);
    const std::vector<int> full = {0, 1, 2, 3};
    const std::vector<int> skips_1 = {0, 2, 3};
    ZERO_RETURN_IF_ERROR(recorded_pass(r, full));
    ZERO_RETURN_IF_ERROR(recorded_pass(r, skips_1));
    // Acquiring 0 prefetched 1 along the record; the pass then left it, so that gather was wasted.
    EXPECT_EQ(r.meter.volume().param_gather, gather_bytes(r.units, {0, 1, 2, 3}));

    ZERO_RETURN_IF_ERROR(recorded_pass(r, skips_1));
    EXPECT_EQ(r.meter.volume().param_gather, gather_bytes(r.units, skips_1)) << "the new order was recorded";
    EXPECT_EQ(comm_buffers_peak(r.allocator), prefetched_peak(r.units, skips_1));
    return absl::OkStatus();
  }));
}

TEST(ParamGatherer, ReleaseKeepsACopyThePlanNeedsWithinMaxLiveGathers) {
  expect_all_ok(run_local_ranks(kRanks, [](Communicator& comm) -> absl::Status {
    RankUnits r(comm, 3);
    const std::vector<int> plan = {3, 0, 3};  // the head, its tied owner, the head again
    ZERO_RETURN_IF_ERROR(planned_pass(r, plan));
    EXPECT_EQ(r.meter.volume().param_gather, gather_bytes(r.units, {3, 0})) << "the head's copy was kept";
    return absl::OkStatus();
  }));
}

TEST(ParamGatherer, AllgatherUpdatedBringsEveryRanksUpdatedSliceToEveryRank) {
  expect_all_ok(run_local_ranks(kRanks, [](Communicator& comm) -> absl::Status {
    RankUnits r(comm, 1);  // held whole, each rank updating its slice
    const UnitState& u = r.units[1];
    EXPECT_FALSE(u.sharded);
    const Tensor own = u.own_params(DType::kF32);
    for (int64_t k = 0; k < own.numel(); ++k) own.data_as<float>()[k] = static_cast<float>(-(comm.rank() + 1));
    Work gather = r.gatherer->allgather_updated(1);
    ZERO_RETURN_IF_ERROR(r.meter.wait(gather));
    const Tensor held = u.held_params(DType::kF32);
    for (int64_t k = 0; k < u.layout.padded_numel; ++k) {
      EXPECT_EQ(held.data_as<float>()[k], static_cast<float>(-(k / u.layout.shard_numel + 1))) << "element " << k;
    }
    EXPECT_EQ(r.meter.volume().param_gather, gather_bytes(r.units, {1}));
    return absl::OkStatus();
  }));
}

// The engine's own passes: every gather they send is one of the gatherer's plan, and no more.
TEST(ParamGatherer, EngineEvaluationAndFullVisitsSendExactlyThePlannedGathers) {
  const testing::ToyConfig toy;  // input, hidden_0, hidden_1, head tied to input.weight
  expect_all_ok(run_local_ranks(kRanks, [&](Communicator& comm) -> absl::Status {
    testing::ToyModel model(toy);
    Allocator allocator(comm.rank());
    ZERO_ASSIGN_OR_RETURN(
        std::unique_ptr<Engine> engine,
        Engine::create(model, comm, allocator, testing::adamw_factory(),
                       ZeroConfig{.stage = 3, .max_live_units = kMaxLive, .persistence_threshold = 0}));
    const std::vector<UnitState> units = *flat_unit_states(model.units(), StagePolicy(3), 0, comm.rank(), kRanks);

    ZERO_RETURN_IF_ERROR(engine->visit_full_params([](auto, auto, const Tensor&) { return absl::OkStatus(); }));
    EXPECT_EQ(engine->comm_volume().param_gather, gather_bytes(units, {0, 1, 2, 3})) << "each unit once";

    engine->reset_comm_volume();
    testing::ToyData data = testing::toy_rows(toy, 4 * comm.rank(), 4 * comm.rank() + 4);
    ZERO_RETURN_IF_ERROR(engine->evaluate(data.batch(toy.features)).status());
    // Each unit as it runs, then the head's tied owner once more.
    EXPECT_EQ(engine->comm_volume().param_gather, gather_bytes(units, {0, 1, 2, 3, 0}));
    EXPECT_EQ(engine->comm_volume().grad_reduce, 0);
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace zero
