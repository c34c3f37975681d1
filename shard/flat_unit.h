// A unit's parameters packed into one flat buffer padded to a multiple of the world size; rank r owns slice r.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "optim/shard_layout.h"
#include "shard/module.h"

namespace zero {

// Where each parameter lives in the flat buffer (numel elements, then padding up to padded_numel).
//   flat (padded_numel) = [p0 | p1 | ... | pad];  rank r owns [r*shard_numel, (r+1)*shard_numel)
struct FlatLayout {
  std::vector<FlatParam> params;  // offset and numel per ParamSpec, in declaration order
  std::vector<Shape> shapes;
  int64_t numel = 0;
  int64_t padded_numel = 0;  // numel rounded up to a multiple of world_size
  int64_t shard_numel = 0;   // padded_numel / world_size
  int world_size = 1;

  static FlatLayout of(const std::vector<ParamSpec>& specs, int world_size);
  int64_t shard_begin(int rank) const { return rank * shard_numel; }
  // The index of the parameter named `name`, or -1.
  int find(const std::string& name) const;
};

}  // namespace zero
