// Parameter gathers: stage 3's just-in-time allgathers with prefetch, and the allgather after an update.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "shard/meter.h"
#include "shard/unit_state.h"

namespace zero {

// Owns the gathered copies of sharded units (comm_buffers, (P) each) and the gathers in flight. Every
// read of a sharded unit's full parameters goes through a *pass*: a sequence of acquire/release calls
// whose gathers follow a plan, prefetched so that at most max_live_units copies are alive.
//
//   training step   the plan is the order recorded on an earlier step; a step that leaves it stops
//                   prefetching, gathers on demand, and its order is recorded for the next
//   evaluation      the plan is known before the pass: the units that run and their tied owners
//   full visits     the plan is every sharded unit in order (export, visit_full_params)
//
// Every rank must make the same calls in the same order: each gather is a collective. Used from the
// compute thread only.
class ParamGatherer {
 public:
  ParamGatherer(const RankContext& rank, int max_live_units);
  ~ParamGatherer();  // waits for the gathers in flight: none may write into freed memory

  // A training step's pass, which replays and (if it departs from it) re-records the order.
  void begin_recorded_pass();
  // A pass whose gathers are `plan`, in order (indices of sharded units).
  void begin_planned_pass(std::vector<int> plan);
  // Waits for every gather in flight and frees every gathered copy; a recorded pass that departed from
  // its plan records its own order for the next.
  absl::Status end_pass();
  // The next recorded pass starts without a plan (after a checkpoint changed what a step may do).
  void forget_recorded_order() { recorded_.clear(); }

  // Makes the full parameters of `owners` available (gathering the sharded ones, in this order), then
  // prefetches along the plan.
  absl::Status acquire(std::span<const int> owners);
  // Frees the gathered copies of `owners`, but those among the plan's next max_live_units gathers:
  // prefetch would gather them again at once, so keeping them saves the allgather and holds no more
  // copies (the last unit from its forward into its backward, the first across micro-batches, a tied
  // owner its user reads next).
  void release(std::span<const int> owners);

  // Unit i's full (P) params: its gathered copy when sharded (between acquire and release), else held.
  Tensor full_params(int i) const;

  // For a unit held whole where each rank updates only its slice: the allgather that brings every
  // rank's updated slice to every rank. The caller waits for it (CommMeter::wait).
  Work allgather_updated(int i);

  // The most elements of gathered copies alive at once: the max_live_units largest sharded units.
  int64_t most_live_numel() const;

 private:
  absl::Status start_gather(int i);
  absl::Status finish_gather(int i);  // waits for the unit's gather in flight, if any
  std::span<const int> upcoming() const;
  absl::Status prefetch();
  int live_copies() const;

  const RankContext rank_;
  std::vector<UnitState>& units_;  // rank_.units
  const int max_live_units_;
  std::vector<Buffer> gathered_;             // per unit: (P) while gathered, else empty
  std::vector<std::optional<Work>> flight_;  // per unit: its gather in flight
  std::vector<Buffer> staged_;  // per unit: a host shard's copy on the device while its gather is in flight

  std::vector<int> recorded_;  // the last recorded pass's gathers
  std::vector<int> plan_;      // this pass's
  std::vector<int> taken_;     // the gathers this pass made so far
  bool follows_plan_ = false;
  bool recording_ = false;
};

}  // namespace zero
