// Which sequences each rank reads in an epoch: PyTorch's DistributedSampler, computed by every rank alone.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace zero::data {

struct SamplerOptions {
  int world_size = 1;  // N
  int rank = 0;        // r, 0 <= r < N
  bool shuffle = true;
  uint64_t seed = 0;
  // As DistributedSampler's drop_last. false: the epoch's index list is padded by repeating its own head
  // until its length is a multiple of N, so every index is read and a few twice. true: its tail is cut
  // to the largest multiple of N, so no index is read twice and up to N - 1 are skipped this epoch.
  bool drop_last = false;
};

// Over a dataset of `size` items, epoch e's list is a permutation of [0, size) (the identity without
// shuffle), padded or cut as above to num_samples() * N entries; rank r takes entries r, r + N, r + 2N, ...
// The permutation is a Fisher-Yates shuffle driven by splitmix64 keyed by (seed, e) alone, so every rank
// computes the same one without communicating. It is not torch.randperm's: the same seed gives a
// different (equally uniform) order than PyTorch.
class DistributedSampler {
 public:
  static absl::StatusOr<DistributedSampler> create(int64_t size, const SamplerOptions& options);

  int64_t size() const { return size_; }
  const SamplerOptions& options() const { return options_; }
  // Items each rank gets per epoch: ceil(size / N), or floor(size / N) with drop_last.
  int64_t num_samples() const { return num_samples_; }
  // Rank r's items in epoch `epoch`, in reading order; num_samples() of them.
  std::vector<int64_t> indices(int64_t epoch) const;
  // The whole epoch's list before it is dealt to ranks: num_samples() * N entries.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  DistributedSampler(int64_t size, const SamplerOptions& options);
  int64_t size_;
  SamplerOptions options_;
  int64_t num_samples_;
};

}  // namespace zero::data
