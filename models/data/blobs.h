// The MLP's generated task: D-dimensional points from K Gaussian clusters ("blobs"), labelled by their cluster.
#pragma once

// Cluster centres: centre k is N(0, I_D), drawn from the seed alone. Example m of the stream is a label
// y uniform in [0, K) and the point centre_y + noise * N(0, I_D), drawn from (seed, m) alone, so any rank
// reads any row in any order and every rank sees the same data. With the default noise 1 and D = 16 two
// centres are about sqrt(2D) = 5.7 apart, so the clusters barely overlap; raise noise to make them.
//
// Split: the stream is dealt by index, whatever the seed: val row i is stream example 10 i, train row i
// is the i-th index not divisible by 10 (10 (i / 9) + 1 + i % 9). No val point is ever trained on, and a
// train set of any size never reaches into the val stream.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "models/data/dataset.h"

namespace zero::data {

enum class BlobsSplit : uint8_t { kTrain, kVal };

struct BlobsConfig {
  int64_t features = 16;   // D
  int64_t classes = 4;     // K
  double noise = 1.0;      // standard deviation of a point about its centre, per feature
  int64_t rows = 1 << 14;  // examples in the dataset
  uint64_t seed = 1;
  BlobsSplit split = BlobsSplit::kTrain;
};

class BlobsDataset final : public FeatureDataset {
 public:
  // Fails unless D >= 1, K >= 2, noise >= 0 and rows >= 1.
  static absl::StatusOr<BlobsDataset> create(const BlobsConfig& config);

  const BlobsConfig& config() const { return config_; }
  int64_t size() const override { return config_.rows; }
  int64_t num_features() const override { return config_.features; }
  int64_t num_classes() const override { return config_.classes; }
  int32_t read(int64_t i, std::span<float> features) const override;

  // Which example of the seed's stream row i of this split is.
  int64_t stream_index(int64_t i) const;
  // Centre k, (D).
  std::span<const float> centre(int64_t k) const;

 private:
  BlobsDataset(const BlobsConfig& config, std::vector<float> centres) : config_(config), centres_(std::move(centres)) {}
  BlobsConfig config_;
  std::vector<float> centres_;  // (K, D)
};

}  // namespace zero::data
