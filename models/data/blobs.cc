// The blobs task: seeded Gaussian cluster centres, points drawn about them from (seed, index), and the fixed split.
#include "models/data/blobs.h"

#include <cmath>
#include <numbers>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/data/random.h"
#include "runtime/status.h"

namespace zero::data {
namespace {

// Keys the centres' stream apart from the examples' streams (which are keyed by seed ^ index).
constexpr uint64_t kCentreSalt = 0x63656e7472657321ull;

// A uniform double in (0, 1]: the top 53 bits of a draw, plus one.
double uniform_open(CounterRng& rng) { return static_cast<double>((rng.next() >> 11) + 1) * 0x1.0p-53; }

// A standard normal draw (Box-Muller, one of the pair).
double normal(CounterRng& rng) {
  const double radius = std::sqrt(-2.0 * std::log(uniform_open(rng)));
  return radius * std::cos(2.0 * std::numbers::pi * uniform_open(rng));
}

}  // namespace

absl::StatusOr<BlobsDataset> BlobsDataset::create(const BlobsConfig& config) {
  if (config.features < 1 || config.classes < 2 || !(config.noise >= 0) || config.rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("BlobsDataset: features ", config.features, ", classes ",
                                                   config.classes, ", noise ", config.noise, ", rows ", config.rows,
                                                   "; need features >= 1, classes >= 2, noise >= 0, rows >= 1"));
  }
  std::vector<float> centres(static_cast<size_t>(config.classes * config.features));
  CounterRng rng(splitmix64(config.seed) ^ kCentreSalt);
  for (float& c : centres) c = static_cast<float>(normal(rng));
  return BlobsDataset(config, std::move(centres));
}

int64_t BlobsDataset::stream_index(int64_t i) const {
  return config_.split == BlobsSplit::kVal ? 10 * i : 10 * (i / 9) + 1 + i % 9;
}

std::span<const float> BlobsDataset::centre(int64_t k) const {
  ZERO_CHECK(k >= 0 && k < config_.classes, "class ", k, " out of [0, ", config_.classes, ")");
  return {centres_.data() + k * config_.features, static_cast<size_t>(config_.features)};
}

int32_t BlobsDataset::read(int64_t i, std::span<float> features) const {
  ZERO_CHECK(i >= 0 && i < size(), "row ", i, " out of [0, ", size(), ")");
  ZERO_CHECK(static_cast<int64_t>(features.size()) == config_.features, "features must hold D = ", config_.features);
  CounterRng rng(splitmix64(config_.seed) ^ static_cast<uint64_t>(stream_index(i)));
  const auto label = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config_.classes)));
  const std::span<const float> c = centre(label);
  for (size_t d = 0; d < features.size(); ++d) {
    features[d] = c[d] + static_cast<float>(config_.noise * normal(rng));
  }
  return label;
}

}  // namespace zero::data
