// The interface every source of training sequences implements, so one DataLoader serves token shards and generated tasks.
#pragma once

#include <cstdint>
#include <span>

namespace zero::data {

// A target the loss and the accuracy skip (the cross-entropy kernels' ignore index).
inline constexpr int32_t kIgnoreTarget = -1;

// A fixed, finite, random-access set of sequences of T+1 tokens. Sequence i gives T inputs and T targets:
// targets[t] is the token after inputs[t], or kIgnoreTarget where that prediction should not count.
// read() is const and thread-safe, so the ranks of one process (threads of the local backend) share one
// dataset.
class SequenceDataset {
 public:
  virtual ~SequenceDataset() = default;
  // How many sequences there are.
  virtual int64_t size() const = 0;
  // T, the length of inputs and targets.
  virtual int64_t seq_len() const = 0;
  // Writes sequence i, 0 <= i < size(): inputs (T) and targets (T).
  virtual void read(int64_t i, std::span<int32_t> inputs, std::span<int32_t> targets) const = 0;
};

}  // namespace zero::data
