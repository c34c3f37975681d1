// DataLoader: gathers this rank's sampled examples into (B, ...) input and target buffers, epoch after epoch.
#include "models/data/data_loader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero::data {
namespace {

// (B, *row): the micro-batch shape of a row shape.
Shape batched(int64_t batch_size, const Shape& row) {
  Shape shape = {batch_size};
  shape.insert(shape.end(), row.begin(), row.end());
  return shape;
}

}  // namespace

absl::StatusOr<DataLoader> DataLoader::create(std::shared_ptr<const Dataset> dataset, int64_t batch_size,
                                              const SamplerOptions& options, Allocator& allocator) {
  ZERO_CHECK(dataset != nullptr, "DataLoader needs a dataset");
  if (batch_size < 1) return absl::InvalidArgumentError(absl::StrCat("DataLoader: batch size ", batch_size, " < 1"));
  ZERO_ASSIGN_OR_RETURN(DistributedSampler sampler, DistributedSampler::create(dataset->size(), options));
  const ExampleLayout layout = dataset->layout();
  if (sampler.num_samples() < batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DataLoader: the dataset has ", dataset->size(), " examples of inputs (", shape_string(layout.input_shape),
        "); dealt to ", options.world_size, " ranks that is ", sampler.num_samples(),
        " per rank, fewer than one micro-batch of B = ", batch_size, "; use more data or a smaller B"));
  }
  const int64_t input_bytes =
      batch_size * shape_numel(layout.input_shape) * static_cast<int64_t>(dtype_size(layout.input_dtype));
  const int64_t target_bytes = batch_size * shape_numel(layout.target_shape) * static_cast<int64_t>(sizeof(int32_t));
  ZERO_ASSIGN_OR_RETURN(Buffer inputs, allocator.allocate(input_bytes, MemoryCategory::kActivations));
  ZERO_ASSIGN_OR_RETURN(Buffer targets, allocator.allocate(target_bytes, MemoryCategory::kActivations));
  return DataLoader(std::move(dataset), batch_size, std::move(sampler), std::move(inputs), std::move(targets));
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, int64_t batch_size, DistributedSampler sampler,
                       Buffer inputs, Buffer targets)
    : dataset_(std::move(dataset)), batch_size_(batch_size), sampler_(std::move(sampler)), layout_(dataset_->layout()),
      inputs_buffer_(std::move(inputs)), targets_buffer_(std::move(targets)) {
  batch_view_ = Batch{inputs_buffer_.tensor(layout_.input_dtype, batched(batch_size_, layout_.input_shape)),
                      targets_buffer_.tensor(DType::kI32, batched(batch_size_, layout_.target_shape))};
  set_epoch(0);
}

void DataLoader::set_epoch(int64_t epoch, int64_t batch) {
  ZERO_CHECK(batch >= 0 && batch < batches_per_epoch(), "batch ", batch, " out of [0, ", batches_per_epoch(), ")");
  if (order_.empty() || epoch != epoch_) order_ = sampler_.indices(epoch);
  epoch_ = epoch;
  batch_ = batch;
}

const Batch& DataLoader::next() {
  const size_t input_bytes = batch_view_.inputs.nbytes() / static_cast<size_t>(batch_size_);
  const size_t targets = static_cast<size_t>(batch_view_.targets.numel() / batch_size_);
  auto* inputs = static_cast<std::byte*>(batch_view_.inputs.data());
  int32_t* target_data = batch_view_.targets.data_as<int32_t>();
  for (int64_t b = 0; b < batch_size_; ++b) {
    const int64_t index = order_[static_cast<size_t>(batch_ * batch_size_ + b)];
    dataset_->read_example(index, {inputs + b * input_bytes, input_bytes}, {target_data + b * targets, targets});
  }
  if (batch_ + 1 < batches_per_epoch()) {
    ++batch_;
  } else {
    set_epoch(epoch_ + 1);
  }
  return batch_view_;
}

}  // namespace zero::data
