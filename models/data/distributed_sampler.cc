// DistributedSampler: seeded per-epoch permutation, padding or cutting to a multiple of N, strided deal.
#include "models/data/distributed_sampler.h"

#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/data/random.h"

namespace zero::data {

absl::StatusOr<DistributedSampler> DistributedSampler::create(int64_t size, const SamplerOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("DistributedSampler: rank ", options.rank, " of world size ",
                                                   options.world_size, " is invalid; need 0 <= rank < world size"));
  }
  if (size < 0) return absl::InvalidArgumentError(absl::StrCat("DistributedSampler: dataset size ", size, " < 0"));
  return DistributedSampler(size, options);
}

DistributedSampler::DistributedSampler(int64_t size, const SamplerOptions& options)
    : size_(size), options_(options),
      num_samples_(options.drop_last ? size / options.world_size
                                     : (size + options.world_size - 1) / options.world_size) {}

std::vector<int64_t> DistributedSampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (options_.shuffle) {
    CounterRng rng(splitmix64(options_.seed) ^ static_cast<uint64_t>(epoch));
    for (int64_t i = size_ - 1; i > 0; --i) std::swap(order[i], order[rng.below(static_cast<uint64_t>(i) + 1)]);
  }
  const size_t total = static_cast<size_t>(num_samples_ * options_.world_size);
  order.reserve(total);
  for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i]);  // pad with the list's own head
  order.resize(total);                                                      // or cut the tail
  return order;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  const std::vector<int64_t> order = epoch_order(epoch);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(options_.rank); i < order.size(); i += options_.world_size) {
    mine.push_back(order[i]);
  }
  return mine;
}

}  // namespace zero::data
