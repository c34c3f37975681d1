// Which parameter and group each element of a rank's flat shard belongs to; parameter groups by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace zero {

// One parameter's place in a unit's flat buffer.
struct FlatParam {
  std::string name;
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;
  int group = 0;  // index into the layout's groups
};

// Per-group hyper-parameters: the learning rate is the step's lr times lr_scale.
struct ParamGroup {
  float lr_scale = 1.0f;
  float weight_decay = 0.0f;
};

// A run of shard elements inside one parameter, at most kMaxChunkElements long: the unit of CPU work.
struct ShardChunk {
  int64_t begin = 0;  // shard-local element index
  int64_t end = 0;
  int param = 0;
};
inline constexpr int64_t kMaxChunkElements = int64_t{1} << 16;

// This rank's range [shard_begin, shard_end) of a flat buffer and the parameters packed in that buffer.
// Elements of the shard that belong to no parameter (padding, gaps) are never read or written.
class ShardLayout {
 public:
  // Fails with InvalidArgument on negative sizes, overlapping parameters, or a group index out of range.
  static absl::StatusOr<ShardLayout> create(std::vector<FlatParam> params, std::vector<ParamGroup> groups,
                                            int64_t shard_begin, int64_t shard_end);
  // Rank `rank` of `world_size` over a flat buffer of `flat_numel` elements padded to a multiple of
  // world_size: the shard is [rank*S, (rank+1)*S) with S = padded / world_size (docs/architecture.md).
  static absl::StatusOr<ShardLayout> for_rank(std::vector<FlatParam> params, std::vector<ParamGroup> groups,
                                              int64_t flat_numel, int rank, int world_size);

  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }
  int64_t shard_numel() const { return shard_end_ - shard_begin_; }
  const std::vector<FlatParam>& params() const { return params_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const ParamGroup& group_of(int param) const { return groups_[params_[param].group]; }
  // The shard's elements that belong to parameters, in flat order.
  const std::vector<ShardChunk>& chunks() const { return chunks_; }

 private:
  std::vector<FlatParam> params_;
  std::vector<ParamGroup> groups_;
  int64_t shard_begin_ = 0;
  int64_t shard_end_ = 0;
  std::vector<ShardChunk> chunks_;
};

// Glob patterns (fnmatch, case-insensitive) of parameters that get no weight decay by default:
// biases and LayerNorm weights ("*bias", "*ln_*", "*norm*").
std::vector<std::string> default_no_decay_patterns();

// Two groups, 0 = {1, weight_decay} and 1 = {1, 0}; each parameter whose name matches a pattern goes to
// group 1, the rest to group 0. Returns the groups.
std::vector<ParamGroup> assign_decay_groups(
    std::vector<FlatParam>& params, float weight_decay,
    const std::vector<std::string>& no_decay_patterns = default_no_decay_patterns());

}  // namespace zero
