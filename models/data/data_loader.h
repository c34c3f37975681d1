// One rank's stream of micro-batches over any Dataset (token sequences or labelled features), dealt across ranks by
// DistributedSampler.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/data/dataset.h"
#include "models/data/distributed_sampler.h"
#include "runtime/allocator.h"
#include "shard/module.h"

namespace zero::data {

// Rank r's epoch e is its DistributedSampler indices cut into consecutive micro-batches of B sequences;
// a last partial micro-batch is dropped (as DataLoader's drop_last), so every rank has the same
// batches_per_epoch() and issues the same number of collectives. After the last micro-batch of an epoch,
// next() goes on with the next epoch, reshuffled. The position (epoch, batch) is all the state there is:
// set_epoch(e, b) from a checkpoint resumes exactly where a run stopped.
//
// A micro-batch is inputs (B, *input_shape) and targets (B, *target_shape) of the dataset's layout:
// int32 tokens and targets (B, T) from a SequenceDataset, fp32 features (B, D) and int32 labels (B) from
// a FeatureDataset. The buffers are allocated once from the rank's allocator in the kActivations
// category: they are the model's input and must live through backward (the embedding's backward reads
// the tokens, the first linear layer's the features), like the activations saved for it. They are host
// memory, which the datasets write; units running on a CUDA device need the batch there (module.h's
// UnitContext::device), so the caller copies it over.
class DataLoader {
 public:
  // Fails when the sampler options are invalid, B < 1, or a rank would not get one full micro-batch.
  static absl::StatusOr<DataLoader> create(std::shared_ptr<const Dataset> dataset, int64_t batch_size,
                                           const SamplerOptions& options, Allocator& allocator);

  int64_t batch_size() const { return batch_size_; }  // B
  int64_t batches_per_epoch() const { return sampler_.num_samples() / batch_size_; }
  const Dataset& dataset() const { return *dataset_; }
  const DistributedSampler& sampler() const { return sampler_; }

  // The next micro-batch, shaped as above. Valid until the next call of next().
  const Batch& next();
  // The position of the micro-batch next() returns next.
  int64_t epoch() const { return epoch_; }
  int64_t batch_in_epoch() const { return batch_; }
  // Moves to micro-batch `batch` (0 <= batch < batches_per_epoch()) of epoch `epoch`.
  void set_epoch(int64_t epoch, int64_t batch = 0);

 private:
  DataLoader(std::shared_ptr<const Dataset> dataset, int64_t batch_size, DistributedSampler sampler, Buffer inputs,
             Buffer targets);

  std::shared_ptr<const Dataset> dataset_;
  int64_t batch_size_;
  DistributedSampler sampler_;
  ExampleLayout layout_;
  Buffer inputs_buffer_;   // (B, *input_shape) of input_dtype
  Buffer targets_buffer_;  // int32 (B, *target_shape)
  Batch batch_view_;
  std::vector<int64_t> order_;  // this rank's indices in epoch_
  int64_t epoch_ = 0;
  int64_t batch_ = 0;
};

}  // namespace zero::data
