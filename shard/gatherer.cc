// ParamGatherer: gathered copies, gathers in flight, recorded and planned orders, prefetch within max_live_units.
#include "shard/gatherer.h"

#include <algorithm>

#include "runtime/device_api.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"
#include "shard/offload.h"

namespace zero {

ParamGatherer::ParamGatherer(const RankContext& rank, int max_live_units)
    : rank_(rank), units_(rank.units), max_live_units_(max_live_units), gathered_(units_.size()),
      flight_(units_.size()), staged_(units_.size()) {}

ParamGatherer::~ParamGatherer() {
  for (std::optional<Work>& gather : flight_) {
    if (gather) (void)gather->wait();
  }
}

void ParamGatherer::begin_recorded_pass() {
  plan_ = recorded_;
  taken_.clear();
  follows_plan_ = !plan_.empty();
  recording_ = true;
}

void ParamGatherer::begin_planned_pass(std::vector<int> plan) {
  plan_ = std::move(plan);
  taken_.clear();
  follows_plan_ = true;
  recording_ = false;
}

absl::Status ParamGatherer::end_pass() {
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!units_[i].sharded) continue;
    ZERO_RETURN_IF_ERROR(finish_gather(static_cast<int>(i)));  // prefetches the pass did not use
    gathered_[i].reset();
  }
  if (recording_ && !follows_plan_) recorded_ = taken_;
  return absl::OkStatus();
}

absl::Status ParamGatherer::acquire(std::span<const int> owners) {
  for (const int i : owners) {
    if (!units_[i].sharded) continue;
    const size_t position = taken_.size();
    taken_.push_back(i);
    follows_plan_ = follows_plan_ && position < plan_.size() && plan_[position] == i;
    if (gathered_[i].data() == nullptr) ZERO_RETURN_IF_ERROR(start_gather(i));
    ZERO_RETURN_IF_ERROR(finish_gather(i));
  }
  return prefetch();
}

void ParamGatherer::release(std::span<const int> owners) {
  std::span<const int> next = upcoming();
  next = next.first(std::min(next.size(), static_cast<size_t>(max_live_units_)));
  for (const int i : owners) {
    const bool needed_next = std::find(next.begin(), next.end(), i) != next.end();
    if (units_[i].sharded && !flight_[i] && !needed_next) gathered_[i].reset();
  }
}

Tensor ParamGatherer::full_params(int i) const {
  const UnitState& u = units_[i];
  return (u.sharded ? gathered_[i] : u.params).tensor(rank_.dtype, {u.layout.padded_numel});
}

Work ParamGatherer::allgather_updated(int i) {
  const UnitState& u = units_[i];
  const Tensor held = u.held_params(rank_.dtype);
  return rank_.meter.counted(&CommVolume::param_gather,
                             [&] { return rank_.comm.allgather(u.own_params(rank_.dtype), held); });
}

int64_t ParamGatherer::most_live_numel() const {
  std::vector<int64_t> sizes;
  for (const UnitState& u : units_) {
    if (u.sharded) sizes.push_back(u.layout.padded_numel);
  }
  return sum_of_largest(std::move(sizes), static_cast<size_t>(max_live_units_));
}

absl::Status ParamGatherer::start_gather(int i) {
  const UnitState& u = units_[i];
  ZERO_ASSIGN_OR_RETURN(gathered_[i],
                        rank_.allocator.allocate(u.layout.padded_numel * static_cast<int64_t>(dtype_size(rank_.dtype)),
                                                 MemoryCategory::kCommBuffers, rank_.device));
  ZERO_RETURN_IF_ERROR(rank_.allocator.page_in(u.params.data()));  // offload_param: the shard from its file
  Tensor shard = u.held_params(rank_.dtype);
  if (shard.device() != rank_.device) {
    // A shard in pinned host memory (offload_param_to_host) goes to the device first, on the compute stream, which
    // orders it before the collective (its post event) without the host waiting for it.
    ZERO_ASSIGN_OR_RETURN(staged_[i],
                          rank_.allocator.allocate(shard.nbytes(), MemoryCategory::kCommBuffers, rank_.device));
    const Tensor staged = staged_[i].tensor(rank_.dtype, {u.held_numel});
    ZERO_RETURN_IF_ERROR(device_api(rank_.device)
                             ->copy_async(staged.data(), shard.data(), shard.nbytes(), current_stream(rank_.device)));
    shard = staged;
  }
  const Tensor full = gathered_[i].tensor(rank_.dtype, {u.layout.padded_numel});
  flight_[i] = rank_.meter.counted(&CommVolume::param_gather, [&] { return rank_.comm.allgather(shard, full); });
  return absl::OkStatus();
}

absl::Status ParamGatherer::finish_gather(int i) {
  if (!flight_[i]) return absl::OkStatus();
  absl::Status s = rank_.meter.wait(*flight_[i]);
  flight_[i].reset();
  staged_[i].reset();
  s.Update(rank_.allocator.drop_unchanged(units_[i].params.data()));  // offload_param: the shard, only read
  return s;
}

std::span<const int> ParamGatherer::upcoming() const {
  if (!follows_plan_) return {};
  return std::span<const int>(plan_).subspan(taken_.size());
}

absl::Status ParamGatherer::prefetch() {
  // Every rank follows the same plan, so every rank issues the same collectives.
  for (const int next : upcoming()) {
    if (live_copies() >= max_live_units_) break;
    if (gathered_[next].data() == nullptr) ZERO_RETURN_IF_ERROR(start_gather(next));
  }
  return absl::OkStatus();
}

int ParamGatherer::live_copies() const {
  return static_cast<int>(
      std::count_if(gathered_.begin(), gathered_.end(), [](const Buffer& b) { return b.data() != nullptr; }));
}

}  // namespace zero
