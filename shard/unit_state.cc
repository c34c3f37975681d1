// Flat unit states: layouts, held and updated ranges, tied-parameter owners, and the cross-rank check.
#include "shard/unit_state.h"

#include <algorithm>
#include <functional>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/kernels.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"
#include "shard/init.h"
#include "shard/wrap.h"

namespace zero {

absl::StatusOr<std::vector<UnitState>> flat_unit_states(const std::vector<Unit*>& units, StagePolicy policy,
                                                        int64_t persistence_threshold, int rank, int world_size) {
  std::vector<UnitState> states(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    UnitState& u = states[i];
    u.unit = units[i];
    u.name = std::string(units[i]->name());
    u.layout = FlatLayout::of(units[i]->param_specs(), world_size);
    u.slice_begin = u.layout.shard_begin(rank);
    u.sharded = policy.shards_params(u.layout.numel, persistence_threshold);
    u.held_begin = u.sharded ? u.slice_begin : 0;
    u.held_numel = u.sharded ? u.layout.shard_numel : u.layout.padded_numel;
    u.own_begin = policy.updates_everything() ? 0 : u.slice_begin;
    u.own_count = policy.updates_everything() ? u.layout.numel : u.layout.shard_numel;
    u.grads_sliced = policy.partitions_gradients();
    u.grads_numel = u.grads_sliced ? u.layout.shard_numel : u.layout.padded_numel;
    u.needs = {static_cast<int>(i)};
    for (const TiedParam& tied : units[i]->tied_params()) {
      const auto owner = std::find_if(states.begin(), states.begin() + i,
                                      [&](const UnitState& o) { return o.name == tied.owner_unit; });
      if (owner == states.begin() + i || owner->layout.find(tied.param) < 0) {
        return absl::InvalidArgumentError(absl::StrCat("unit '", u.name, "' ties to '", tied.owner_unit, ".",
                                                       tied.param, "', which no earlier unit declares"));
      }
      const int owner_index = static_cast<int>(owner - states.begin());
      u.needs.push_back(owner_index);
      u.tied_owner[tied.param] = owner_index;
    }
  }
  return states;
}

int64_t sum_of_largest(std::vector<int64_t> sizes, size_t k) {
  k = std::min(k, sizes.size());
  std::partial_sort(sizes.begin(), sizes.begin() + k, sizes.end(), std::greater<>());
  return std::accumulate(sizes.begin(), sizes.begin() + k, int64_t{0});
}

void initial_held_values(const UnitState& u, uint64_t seed, float* held) {
  std::fill(held, held + u.held_numel, 0.0f);  // padding stays zero
  const std::vector<ParamSpec> specs = u.unit->param_specs();
  for (size_t p = 0; p < specs.size(); ++p) {
    const FlatParam& fp = u.layout.params[p];
    const int64_t begin = std::max(fp.offset, u.held_begin);
    const int64_t end = std::min(fp.offset + fp.numel, u.held_begin + u.held_numel);
    if (begin >= end) continue;
    const auto [unit, param] = model_param_name(u.name, specs[p].name);
    init_values(specs[p].init, seed, param_key(unit, param), begin - fp.offset, end - fp.offset,
                held + (begin - u.held_begin));
  }
}

absl::Status check_same_units_on_every_rank(const std::vector<Unit*>& units, Communicator& comm) {
  std::string layout;  // "unit:param(shape),param(shape);unit:..." in order
  for (Unit* u : units) {
    absl::StrAppend(&layout, u->name(), ":");
    for (const ParamSpec& spec : u->param_specs()) absl::StrAppend(&layout, spec.name, shape_string(spec.shape), ",");
    absl::StrAppend(&layout, ";");
  }
  // FNV-1a of the layout: the same in every process.
  ZERO_ASSIGN_OR_RETURN(const std::vector<int> differ, ranks_unlike_rank_0(comm, param_key(layout, "")));
  if (differ.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the model differs across ranks: rank(s) ", absl::StrJoin(differ, ", "),
                   " declare units, parameters or sizes other than rank 0's; build the same model on every rank"));
}

absl::Status cast_from_host(const Tensor& dst, const Tensor& host, Allocator& allocator) {
  if (dst.device().is_cpu()) return kernels::cast(dst, host);
  ZERO_ASSIGN_OR_RETURN(
      Buffer staged, allocator.allocate(static_cast<int64_t>(host.nbytes()), MemoryCategory::kWorkspace, dst.device()));
  ZERO_RETURN_IF_ERROR(copy_bytes(staged.data(), dst.device(), host.data(), Device::cpu(), host.nbytes()));
  return kernels::cast(dst, staged.tensor(host.dtype(), host.shape()));
}

}  // namespace zero
