#include "models/data/data_loader.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/status.h"

namespace zero::data {
namespace {

using ::testing::HasSubstr;

// Sequence i is inputs [1000 i, 1000 i + T), targets one more: each row names its sequence.
class CountingDataset final : public SequenceDataset {
 public:
  CountingDataset(int64_t size, int64_t seq_len) : size_(size), seq_len_(seq_len) {}
  int64_t size() const override { return size_; }
  int64_t seq_len() const override { return seq_len_; }
  void read(int64_t i, std::span<int32_t> inputs, std::span<int32_t> targets) const override {
    for (int64_t t = 0; t < seq_len_; ++t) {
      inputs[t] = static_cast<int32_t>(1000 * i + t);
      targets[t] = static_cast<int32_t>(1000 * i + t + 1);
    }
  }

 private:
  int64_t size_, seq_len_;
};

DataLoader make_loader(Allocator& allocator, int64_t size, int64_t batch_size, int world_size, int rank) {
  absl::StatusOr<DataLoader> loader =
      DataLoader::create(std::make_shared<CountingDataset>(size, 3), batch_size,
                         SamplerOptions{.world_size = world_size, .rank = rank, .seed = 11}, allocator);
  ZERO_CHECK(loader.ok(), loader.status().ToString());
  return std::move(*loader);
}

// The sequence each row of the batch holds, checking the rows are whole sequences with their targets.
std::vector<int64_t> rows_of(const Batch& batch) {
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < batch.inputs.size(0); ++b) {
    const int32_t* in = batch.inputs.data_as<int32_t>() + b * 3;
    const int32_t* tg = batch.targets.data_as<int32_t>() + b * 3;
    EXPECT_EQ(in[0] % 1000, 0);
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(in[t], in[0] + t);
      EXPECT_EQ(tg[t], in[t] + 1);
    }
    rows.push_back(in[0] / 1000);
  }
  return rows;
}

std::vector<int64_t> slice(const std::vector<int64_t>& v, int64_t begin, int64_t count) {
  return {v.begin() + begin, v.begin() + begin + count};
}

TEST(DataLoader, BatchesAreTheRanksSampledSequencesInOrder) {
  Allocator allocator;
  DataLoader loader = make_loader(allocator, 40, 4, 3, 1);  // 14 per rank: 3 batches, 2 left over
  ASSERT_EQ(loader.batches_per_epoch(), 3);
  const std::vector<int64_t> mine = loader.sampler().indices(0);
  for (int64_t b = 0; b < 3; ++b) {
    const Batch& batch = loader.next();
    EXPECT_EQ(batch.inputs.shape(), (Shape{4, 3}));
    EXPECT_EQ(batch.targets.shape(), (Shape{4, 3}));
    EXPECT_EQ(batch.inputs.dtype(), DType::kI32);
    EXPECT_EQ(rows_of(batch), slice(mine, 4 * b, 4)) << "batch " << b;
  }
}

TEST(DataLoader, AfterTheLastBatchGoesOnWithTheNextEpochReshuffled) {
  Allocator allocator;
  DataLoader loader = make_loader(allocator, 40, 4, 3, 1);
  for (int b = 0; b < 3; ++b) loader.next();
  EXPECT_EQ(loader.epoch(), 1);
  EXPECT_EQ(loader.batch_in_epoch(), 0);
  const std::vector<int64_t> epoch1 = loader.sampler().indices(1);
  EXPECT_NE(epoch1, loader.sampler().indices(0));
  EXPECT_EQ(rows_of(loader.next()), slice(epoch1, 0, 4));
}

TEST(DataLoader, SetEpochResumesExactlyWhereARunStopped) {
  Allocator allocator;
  DataLoader running = make_loader(allocator, 40, 4, 3, 2);
  for (int b = 0; b < 5; ++b) running.next();  // into epoch 1, batch 2
  DataLoader resumed = make_loader(allocator, 40, 4, 3, 2);
  resumed.set_epoch(running.epoch(), running.batch_in_epoch());
  EXPECT_EQ(running.epoch(), 1);
  EXPECT_EQ(running.batch_in_epoch(), 2);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(rows_of(resumed.next()), rows_of(running.next())) << "batch " << b;
}

TEST(DataLoader, RanksReadDisjointSequencesInOneStep) {
  Allocator allocator;
  std::vector<int64_t> all;
  for (int r = 0; r < 4; ++r) {
    const std::vector<int64_t> rows = rows_of(make_loader(allocator, 40, 5, 4, r).next());
    all.insert(all.end(), rows.begin(), rows.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());
  EXPECT_EQ(all.size(), 20u);
}

TEST(DataLoader, TokenBuffersAreAccountedAsActivations) {
  Allocator allocator;
  DataLoader loader = make_loader(allocator, 40, 4, 1, 0);
  EXPECT_EQ(allocator.stats().current_of(MemoryCategory::kActivations), 2 * 4 * 3 * 4);
  EXPECT_EQ(allocator.stats().current_total, 2 * 4 * 3 * 4);
}

TEST(DataLoader, FewerSequencesThanOneBatchPerRankIsAnError) {
  Allocator allocator;
  absl::StatusOr<DataLoader> loader = DataLoader::create(std::make_shared<CountingDataset>(10, 3), 4,
                                                         SamplerOptions{.world_size = 4, .rank = 0}, allocator);
  EXPECT_EQ(loader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loader.status().message(), HasSubstr("that is 3 per rank, fewer than one micro-batch of B = 4"));
}

}  // namespace
}  // namespace zero::data
