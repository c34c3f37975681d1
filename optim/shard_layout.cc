#include "optim/shard_layout.h"

#include <fnmatch.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zero {

absl::StatusOr<ShardLayout> ShardLayout::create(std::vector<FlatParam> params, std::vector<ParamGroup> groups,
                                                int64_t shard_begin, int64_t shard_end) {
  if (shard_begin < 0 || shard_end < shard_begin) {
    return absl::InvalidArgumentError(absl::StrCat("shard [", shard_begin, ", ", shard_end, ") is not a range"));
  }
  std::vector<int> order(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const FlatParam& p = params[i];
    if (p.offset < 0 || p.numel < 0) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' has offset ", p.offset, " and numel ",
                                                     p.numel, "; both must be non-negative"));
    }
    if (p.group < 0 || p.group >= static_cast<int>(groups.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", p.name, "' is in group ", p.group, " but there are ", groups.size(), " groups"));
    }
    order[i] = static_cast<int>(i);
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) { return params[a].offset < params[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const FlatParam& a = params[order[i - 1]];
    const FlatParam& b = params[order[i]];
    if (b.offset < a.offset + a.numel) {
      return absl::InvalidArgumentError(absl::StrCat("parameters '", a.name, "' [", a.offset, ", ", a.offset + a.numel,
                                                     ") and '", b.name, "' [", b.offset, ", ", b.offset + b.numel,
                                                     ") overlap in the flat buffer"));
    }
  }
  ShardLayout layout;
  layout.shard_begin_ = shard_begin;
  layout.shard_end_ = shard_end;
  for (int i : order) {
    const int64_t lo = std::max(params[i].offset, shard_begin);
    const int64_t hi = std::min(params[i].offset + params[i].numel, shard_end);
    for (int64_t b = lo; b < hi; b += kMaxChunkElements) {
      layout.chunks_.push_back({b - shard_begin, std::min(b + kMaxChunkElements, hi) - shard_begin, i});
    }
  }
  layout.params_ = std::move(params);
  layout.groups_ = std::move(groups);
  return layout;
}

absl::StatusOr<ShardLayout> ShardLayout::for_rank(std::vector<FlatParam> params, std::vector<ParamGroup> groups,
                                                  int64_t flat_numel, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size || flat_numel < 0) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", world_size, " over ", flat_numel,
                                                   " elements: need 0 <= rank < world_size and flat_numel >= 0"));
  }
  for (const FlatParam& p : params) {
    if (p.offset + p.numel > flat_numel) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name, "' ends at ", p.offset + p.numel,
                                                     ", past the flat buffer of ", flat_numel, " elements"));
    }
  }
  const int64_t per_rank = (flat_numel + world_size - 1) / world_size;
  return create(std::move(params), std::move(groups), rank * per_rank, (rank + 1) * per_rank);
}

std::vector<std::string> default_no_decay_patterns() { return {"*bias", "*ln_*", "*norm*"}; }

std::vector<ParamGroup> assign_decay_groups(std::vector<FlatParam>& params, float weight_decay,
                                            const std::vector<std::string>& no_decay_patterns) {
  for (FlatParam& p : params) {
    p.group = std::any_of(no_decay_patterns.begin(), no_decay_patterns.end(),
                          [&](const std::string& pattern) {
                            return fnmatch(pattern.c_str(), p.name.c_str(), FNM_CASEFOLD) == 0;
                          })
                  ? 1
                  : 0;
  }
  return {ParamGroup{1.0f, weight_decay}, ParamGroup{1.0f, 0.0f}};
}

}  // namespace zero
