// One flat unit on one rank: its layout, the ranges of it the rank holds and updates, and its buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "optim/optimizer.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "runtime/tensor.h"
#include "shard/flat_unit.h"
#include "shard/meter.h"
#include "shard/module.h"
#include "shard/stage.h"

namespace zero {

// For a unit of padded size P = S·N, rank r's slice is [r·S, (r+1)·S) (shard/flat_unit.h). In the
// engine's precision unless noted:
//   params  (P) held whole, or (S) when `sharded`
//   grads   (P), or (S) when the stage partitions gradients
//   master  fp32 (own_count), bf16/fp16 only: the master weights of the range the rank updates
struct UnitState {
  Unit* unit = nullptr;
  std::string name;
  FlatLayout layout;
  int64_t slice_begin = 0;  // this rank's slice of the unit: [slice_begin, slice_begin + S)
  bool sharded = false;     // StagePolicy::shards_params: the params are held as this rank's slice only
  int64_t held_begin = 0;   // the flat range of params held: the slice when sharded, else all (padded)
  int64_t held_numel = 0;
  int64_t own_begin = 0;      // the flat range this rank updates: every parameter element when the stage
  int64_t own_count = 0;      // updates everything, else its slice
  bool grads_sliced = false;  // StagePolicy::partitions_gradients: grads are held as the slice only
  int64_t grads_numel = 0;    // P, or S when grads_sliced
  std::vector<int> needs;     // units whose params it reads: itself, then the owner of each tied param
  absl::flat_hash_map<std::string, int> tied_owner;  // tied param name -> the unit that owns it

  Buffer params;
  Buffer master;
  Buffer grads;
  std::unique_ptr<Optimizer> optimizer;

  Tensor held_params(DType dtype) const { return params.tensor(dtype, {held_numel}); }
  // The part of the held params this rank updates.
  Tensor own_params(DType dtype) const {
    return sharded ? held_params(dtype) : held_params(dtype).slice(own_begin, own_begin + own_count);
  }
  Tensor held_grads(DType dtype) const { return grads.tensor(dtype, {grads_numel}); }
  // This rank's slice (S) of the reduced gradient.
  Tensor grad_slice(DType dtype) const {
    const int64_t s = layout.shard_numel;
    return grads_sliced ? held_grads(dtype) : held_grads(dtype).slice(slice_begin, slice_begin + s);
  }
  // The gradient of the range this rank updates (own_count).
  Tensor own_grads(DType dtype) const {
    return grads_sliced ? held_grads(dtype) : held_grads(dtype).slice(own_begin, own_begin + own_count);
  }
};

// What the gatherer and the reducer share: a rank's flat units, the communicator and allocator their
// collectives and buffers go through, the meter that counts them, and the training dtype and device.
// Everything it refers to must outlive its users.
struct RankContext {
  std::vector<UnitState>& units;
  Communicator& comm;
  Allocator& allocator;
  CommMeter& meter;
  DType dtype;
  Device device;
};

// The sum of the `k` largest of `sizes`: the most that k of those buffers hold alive at once.
int64_t sum_of_largest(std::vector<int64_t> sizes, size_t k);

// The flat units of `units` on rank `rank` of `world_size`, buffers not yet allocated. Fails naming the
// unit when a tie names a unit that does not come earlier or a parameter its owner does not declare.
absl::StatusOr<std::vector<UnitState>> flat_unit_states(const std::vector<Unit*>& units, StagePolicy policy,
                                                        int64_t persistence_threshold, int rank, int world_size);

// The initial fp32 values of the params `u` holds (held_numel of them, padding zero) from its ParamSpec
// inits: a function of (seed, unit and parameter name, element), so bit-identical for every stage and
// world size.
void initial_held_values(const UnitState& u, uint64_t seed, float* held);

// Host values into the engine's buffers (the way back is runtime/allocator.h's on_host): `host` (CPU)
// converted into `dst` wherever it lives, through a workspace copy on dst's device when that is not the CPU.
absl::Status cast_from_host(const Tensor& dst, const Tensor& host, Allocator& allocator);

// InvalidArgument naming the ranks whose units (names, parameters, shapes) differ from rank 0's. A
// collective: every collective of a step is sized by the units, so ranks with different models would
// exchange mismatched data, or hang.
absl::Status check_same_units_on_every_rank(const std::vector<Unit*>& units, Communicator& comm);

// The views a unit reads, by name: its own parameters and its tied ones, cut from the flat (P) tensor
// `flat(owner)` gives for each unit it needs. The same for parameters and for gradients.
template <typename FlatOf>
absl::StatusOr<ParamViews> unit_views(const std::vector<UnitState>& units, int i, FlatOf&& flat) {
  ParamViews views;
  const auto add = [&](int owner, const std::string& param) -> absl::Status {
    const UnitState& o = units[owner];
    const int p = o.layout.find(param);
    absl::StatusOr<Tensor> all = flat(owner);
    if (!all.ok()) return all.status();
    views.set(param, all->view(o.layout.params[p].offset, o.layout.shapes[p]));
    return absl::OkStatus();
  };
  for (const FlatParam& p : units[i].layout.params) {
    if (absl::Status s = add(i, p.name); !s.ok()) return s;
  }
  for (const auto& [param, owner] : units[i].tied_owner) {
    if (absl::Status s = add(owner, param); !s.ok()) return s;
  }
  return views;
}

}  // namespace zero
