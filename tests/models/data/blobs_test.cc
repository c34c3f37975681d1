#include "models/data/blobs.h"

#include <memory>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/data/data_loader.h"
#include "runtime/status.h"

namespace zero::data {
namespace {

using ::testing::HasSubstr;

BlobsDataset make(BlobsConfig config) {
  absl::StatusOr<BlobsDataset> dataset = BlobsDataset::create(config);
  ZERO_CHECK(dataset.ok(), dataset.status().ToString());
  return *dataset;
}

struct Example {
  std::vector<float> features;
  int32_t label = 0;
  bool operator==(const Example&) const = default;
};

Example read_example(const BlobsDataset& dataset, int64_t i) {
  Example e{std::vector<float>(static_cast<size_t>(dataset.num_features()))};
  e.label = dataset.read(i, e.features);
  return e;
}

TEST(Blobs, RefusesImpossibleConfigsNamingThem) {
  for (BlobsConfig bad :
       {BlobsConfig{.features = 0}, BlobsConfig{.classes = 1}, BlobsConfig{.noise = -1}, BlobsConfig{.rows = 0}}) {
    absl::StatusOr<BlobsDataset> dataset = BlobsDataset::create(bad);
    EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(dataset.status().message(), HasSubstr("need features >= 1, classes >= 2, noise >= 0, rows >= 1"));
  }
}

TEST(Blobs, EachRowIsFixedByTheSeedAndIndexAlone) {
  const BlobsDataset a = make({.features = 5, .classes = 3, .rows = 100, .seed = 7});
  const BlobsDataset b = make({.features = 5, .classes = 3, .rows = 100, .seed = 7});
  for (int64_t i : {99, 0, 42, 42, 7}) EXPECT_EQ(read_example(a, i), read_example(b, i)) << i;  // any order
  const BlobsDataset other_seed = make({.features = 5, .classes = 3, .rows = 100, .seed = 8});
  EXPECT_NE(read_example(a, 3).features, read_example(other_seed, 3).features);
  EXPECT_NE(read_example(a, 3).features, read_example(a, 4).features);
}

TEST(Blobs, LayoutIsFeaturesAndOneLabel) {
  const BlobsDataset d = make({.features = 6, .classes = 3, .rows = 10});
  const ExampleLayout layout = d.layout();
  EXPECT_EQ(layout.input_dtype, DType::kF32);
  EXPECT_EQ(layout.input_shape, Shape({6}));
  EXPECT_EQ(layout.target_shape, Shape());
}

TEST(Blobs, LabelsCoverEveryClassAndPointsSitAtTheirCentre) {
  const BlobsDataset d = make({.features = 4, .classes = 5, .noise = 0.0, .rows = 200});
  std::set<int32_t> labels;
  for (int64_t i = 0; i < d.size(); ++i) {
    const Example e = read_example(d, i);
    ASSERT_GE(e.label, 0);
    ASSERT_LT(e.label, 5);
    labels.insert(e.label);
    const std::span<const float> c = d.centre(e.label);
    EXPECT_EQ(e.features, std::vector<float>(c.begin(), c.end()));  // noise 0: exactly the centre
  }
  EXPECT_EQ(labels.size(), 5u);
}

TEST(Blobs, TrainAndValAreDisjointSlicesOfOneStream) {
  const BlobsConfig config{.features = 3, .classes = 2, .rows = 50, .seed = 3};
  const BlobsDataset train = make(config);
  BlobsConfig val_config = config;
  val_config.split = BlobsSplit::kVal;
  const BlobsDataset val = make(val_config);
  EXPECT_EQ(train.stream_index(0), 1);
  EXPECT_EQ(train.stream_index(8), 9);
  EXPECT_EQ(train.stream_index(9), 11);
  EXPECT_EQ(val.stream_index(3), 30);
  std::set<int64_t> train_indices;
  std::set<std::vector<float>> train_points;
  for (int64_t i = 0; i < 450; ++i) train_indices.insert(train.stream_index(i));
  for (int64_t i = 0; i < train.size(); ++i) train_points.insert(read_example(train, i).features);
  EXPECT_EQ(train_indices.size(), 450u);
  for (int64_t i = 0; i < val.size(); ++i) {
    EXPECT_FALSE(train_indices.contains(val.stream_index(i))) << i;
    EXPECT_FALSE(train_points.contains(read_example(val, i).features)) << i;
  }
  // Both splits share the seed's centres.
  EXPECT_EQ(std::vector<float>(train.centre(1).begin(), train.centre(1).end()),
            std::vector<float>(val.centre(1).begin(), val.centre(1).end()));
}

TEST(Blobs, NoiseIsTheSpreadAboutTheCentre) {
  const BlobsDataset d = make({.features = 8, .classes = 2, .noise = 0.5, .rows = 2000});
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < d.size(); ++i) {
    const Example e = read_example(d, i);
    for (int64_t k = 0; k < 8; ++k) {
      const double offset = e.features[k] - d.centre(e.label)[k];
      sum += offset;
      sum_sq += offset * offset;
    }
  }
  const double n = 8.0 * 2000;
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(sum_sq / n), 0.5, 0.02);
}

TEST(Blobs, DataLoaderDealsFeatureBatchesAcrossRanks) {
  auto dataset = std::make_shared<BlobsDataset>(make({.features = 3, .classes = 4, .rows = 12, .seed = 5}));
  std::set<std::vector<float>> seen;
  for (int rank = 0; rank < 2; ++rank) {
    Allocator allocator(rank);
    absl::StatusOr<DataLoader> loader =
        DataLoader::create(dataset, 3, SamplerOptions{.world_size = 2, .rank = rank, .seed = 9}, allocator);
    ASSERT_TRUE(loader.ok()) << loader.status();
    ASSERT_EQ(loader->batches_per_epoch(), 2);
    const std::vector<int64_t> order = loader->sampler().indices(0);
    for (int64_t b = 0; b < 2; ++b) {
      const Batch& batch = loader->next();
      ASSERT_EQ(batch.inputs.dtype(), DType::kF32);
      ASSERT_EQ(batch.inputs.shape(), Shape({3, 3}));
      ASSERT_EQ(batch.targets.dtype(), DType::kI32);
      ASSERT_EQ(batch.targets.shape(), Shape({3}));
      for (int64_t row = 0; row < 3; ++row) {
        const Example expected = read_example(*dataset, order[static_cast<size_t>(b * 3 + row)]);
        const float* x = batch.inputs.data_as<float>() + row * 3;
        EXPECT_EQ(std::vector<float>(x, x + 3), expected.features);
        EXPECT_EQ(batch.targets.data_as<int32_t>()[row], expected.label);
        EXPECT_TRUE(seen.insert(expected.features).second) << "an example was dealt to two ranks";
      }
    }
  }
  EXPECT_EQ(seen.size(), 12u);  // the two ranks' shares cover the split exactly
}

}  // namespace
}  // namespace zero::data
