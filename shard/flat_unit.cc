#include "shard/flat_unit.h"

namespace zero {

FlatLayout FlatLayout::of(const std::vector<ParamSpec>& specs, int world_size) {
  FlatLayout layout;
  layout.world_size = world_size;
  for (const ParamSpec& spec : specs) {
    const int64_t n = shape_numel(spec.shape);
    layout.params.push_back({.name = spec.name, .offset = layout.numel, .numel = n});
    layout.shapes.push_back(spec.shape);
    layout.numel += n;
  }
  layout.padded_numel = (layout.numel + world_size - 1) / world_size * world_size;
  layout.shard_numel = layout.padded_numel / world_size;
  return layout;
}

int FlatLayout::find(const std::string& name) const {
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace zero
