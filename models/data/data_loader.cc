// DataLoader: gathers this rank's sampled sequences into (B, T) token buffers, epoch after epoch.
#include "models/data/data_loader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero::data {

absl::StatusOr<DataLoader> DataLoader::create(std::shared_ptr<const SequenceDataset> dataset, int64_t batch_size,
                                              const SamplerOptions& options, Allocator& allocator) {
  ZERO_CHECK(dataset != nullptr, "DataLoader needs a dataset");
  if (batch_size < 1) return absl::InvalidArgumentError(absl::StrCat("DataLoader: batch size ", batch_size, " < 1"));
  ZERO_ASSIGN_OR_RETURN(DistributedSampler sampler, DistributedSampler::create(dataset->size(), options));
  if (sampler.num_samples() < batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DataLoader: the dataset has ", dataset->size(), " sequences of T + 1 = ", dataset->seq_len() + 1,
        " tokens; dealt to ", options.world_size, " ranks that is ", sampler.num_samples(),
        " per rank, fewer than one micro-batch of B = ", batch_size, "; use more data or a smaller B or T"));
  }
  const int64_t bytes = batch_size * dataset->seq_len() * static_cast<int64_t>(sizeof(int32_t));
  ZERO_ASSIGN_OR_RETURN(Buffer inputs, allocator.allocate(bytes, MemoryCategory::kActivations));
  ZERO_ASSIGN_OR_RETURN(Buffer targets, allocator.allocate(bytes, MemoryCategory::kActivations));
  return DataLoader(std::move(dataset), batch_size, std::move(sampler), std::move(inputs), std::move(targets));
}

DataLoader::DataLoader(std::shared_ptr<const SequenceDataset> dataset, int64_t batch_size,
                       DistributedSampler sampler, Buffer inputs, Buffer targets)
    : dataset_(std::move(dataset)),
      batch_size_(batch_size),
      sampler_(std::move(sampler)),
      inputs_buffer_(std::move(inputs)),
      targets_buffer_(std::move(targets)) {
  const Shape shape = {batch_size_, dataset_->seq_len()};
  batch_view_ = Batch{inputs_buffer_.tensor(DType::kI32, shape), targets_buffer_.tensor(DType::kI32, shape)};
  set_epoch(0);
}

void DataLoader::set_epoch(int64_t epoch, int64_t batch) {
  ZERO_CHECK(batch >= 0 && batch < batches_per_epoch(), "batch ", batch, " out of [0, ", batches_per_epoch(), ")");
  if (order_.empty() || epoch != epoch_) order_ = sampler_.indices(epoch);
  epoch_ = epoch;
  batch_ = batch;
}

const Batch& DataLoader::next() {
  const int64_t t = seq_len();
  int32_t* inputs = batch_view_.inputs.data_as<int32_t>();
  int32_t* targets = batch_view_.targets.data_as<int32_t>();
  for (int64_t b = 0; b < batch_size_; ++b) {
    const int64_t index = order_[static_cast<size_t>(batch_ * batch_size_ + b)];
    dataset_->read(index, {inputs + b * t, static_cast<size_t>(t)}, {targets + b * t, static_cast<size_t>(t)});
  }
  if (batch_ + 1 < batches_per_epoch()) {
    ++batch_;
  } else {
    set_epoch(epoch_ + 1);
  }
  return batch_view_;
}

}  // namespace zero::data
