// The interfaces every data source implements, so one DataLoader serves token sequences (GPT-2) and labelled features
// (MLP).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "runtime/tensor.h"

namespace zero::data {

// A target the loss and the accuracy skip (the cross-entropy kernels' ignore index).
inline constexpr int32_t kIgnoreTarget = -1;

// What one example is: an input row of input_dtype with input_shape, and int32 targets with target_shape.
// A micro-batch of B examples is inputs (B, *input_shape) and targets (B, *target_shape).
struct ExampleLayout {
  DType input_dtype = DType::kI32;
  Shape input_shape;   // (T) tokens, or (D) features
  Shape target_shape;  // (T) next tokens, or () one class label
};

// A fixed, finite, random-access set of examples, all of one layout. read_example() is const and
// thread-safe, so the ranks of one process (threads of the local backend) share one dataset.
class Dataset {
 public:
  virtual ~Dataset() = default;
  // How many examples there are.
  virtual int64_t size() const = 0;
  virtual ExampleLayout layout() const = 0;
  // Writes example i, 0 <= i < size(): inputs (numel(input_shape) elements of input_dtype, as bytes)
  // and targets (numel(target_shape)).
  virtual void read_example(int64_t i, std::span<std::byte> inputs, std::span<int32_t> targets) const = 0;
};

// Sequences of T+1 tokens. Sequence i gives T inputs and T targets: targets[t] is the token after
// inputs[t], or kIgnoreTarget where that prediction should not count.
class SequenceDataset : public Dataset {
 public:
  // T, the length of inputs and targets.
  virtual int64_t seq_len() const = 0;
  // Writes sequence i, 0 <= i < size(): inputs (T) and targets (T).
  virtual void read(int64_t i, std::span<int32_t> inputs, std::span<int32_t> targets) const = 0;

  ExampleLayout layout() const final { return {DType::kI32, {seq_len()}, {seq_len()}}; }
  void read_example(int64_t i, std::span<std::byte> inputs, std::span<int32_t> targets) const final {
    read(i, {reinterpret_cast<int32_t*>(inputs.data()), inputs.size() / sizeof(int32_t)}, targets);
  }
};

// Points of D fp32 features, each with one class label in [0, K).
class FeatureDataset : public Dataset {
 public:
  virtual int64_t num_features() const = 0;  // D
  virtual int64_t num_classes() const = 0;   // K
  // Writes example i, 0 <= i < size(): its features (D); returns its label.
  virtual int32_t read(int64_t i, std::span<float> features) const = 0;

  ExampleLayout layout() const final { return {DType::kF32, {num_features()}, {}}; }
  void read_example(int64_t i, std::span<std::byte> inputs, std::span<int32_t> targets) const final {
    targets[0] = read(i, {reinterpret_cast<float*>(inputs.data()), inputs.size() / sizeof(float)});
  }
};

}  // namespace zero::data
