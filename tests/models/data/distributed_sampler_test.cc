#include "models/data/distributed_sampler.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/status.h"

namespace zero::data {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

DistributedSampler make(int64_t size, int world_size, int rank, bool drop_last, bool shuffle = true,
                        uint64_t seed = 7) {
  absl::StatusOr<DistributedSampler> sampler = DistributedSampler::create(
      size,
      SamplerOptions{.world_size = world_size, .rank = rank, .shuffle = shuffle, .seed = seed, .drop_last = drop_last});
  ZERO_CHECK(sampler.ok(), sampler.status().ToString());
  return *sampler;
}

// Rank r's j-th index at position j * N + r: the epoch list the ranks were dealt from.
std::vector<int64_t> interleave_ranks(int64_t size, int world_size, bool drop_last, int64_t epoch) {
  std::vector<int64_t> all;
  for (int r = 0; r < world_size; ++r) {
    const std::vector<int64_t> mine = make(size, world_size, r, drop_last).indices(epoch);
    all.resize(std::max(all.size(), mine.size() * world_size));
    for (size_t j = 0; j < mine.size(); ++j) all[j * world_size + r] = mine[j];
  }
  return all;
}

constexpr int kWorldSizes[] = {1, 2, 3, 4, 8};

TEST(DistributedSampler, WithoutShuffleDealsLikePyTorchPadded) {
  // torch.utils.data.DistributedSampler(range(10), num_replicas=3, rank=r, shuffle=False)
  EXPECT_THAT(make(10, 3, 0, false, false).indices(0), ElementsAre(0, 3, 6, 9));
  EXPECT_THAT(make(10, 3, 1, false, false).indices(0), ElementsAre(1, 4, 7, 0));
  EXPECT_THAT(make(10, 3, 2, false, false).indices(0), ElementsAre(2, 5, 8, 1));
}

TEST(DistributedSampler, WithoutShuffleDealsLikePyTorchDropLast) {
  // ... drop_last=True
  EXPECT_THAT(make(10, 3, 0, true, false).indices(0), ElementsAre(0, 3, 6));
  EXPECT_THAT(make(10, 3, 1, true, false).indices(0), ElementsAre(1, 4, 7));
  EXPECT_THAT(make(10, 3, 2, true, false).indices(0), ElementsAre(2, 5, 8));
}

TEST(DistributedSampler, PaddingRepeatsTheListHeadWhenSmallerThanWorld) {
  // size 2 over 5 ranks: [0, 1] padded to [0, 1, 0, 1, 0].
  std::vector<int64_t> firsts;
  for (int r = 0; r < 5; ++r) firsts.push_back(make(2, 5, r, false, false).indices(0).at(0));
  EXPECT_THAT(firsts, ElementsAre(0, 1, 0, 1, 0));
}

TEST(DistributedSampler, DropLastRanksAreDisjointAndCoverAllButTheTail) {
  const int64_t size = 29;
  for (int n : kWorldSizes) {
    std::set<int64_t> seen;
    for (int r = 0; r < n; ++r) {
      const std::vector<int64_t> mine = make(size, n, r, true).indices(3);
      ASSERT_EQ(static_cast<int64_t>(mine.size()), size / n) << "N=" << n;
      for (int64_t i : mine) EXPECT_TRUE(seen.insert(i).second) << "index " << i << " twice, N=" << n;
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), size / n * n) << "N=" << n;
    EXPECT_LT(*seen.rbegin(), size);
  }
}

TEST(DistributedSampler, PaddedRanksCoverEveryIndexRepeatingOnlyThePadding) {
  const int64_t size = 29;
  for (int n : kWorldSizes) {
    std::vector<int64_t> counts(size, 0);
    for (int r = 0; r < n; ++r) {
      const std::vector<int64_t> mine = make(size, n, r, false).indices(3);
      ASSERT_EQ(static_cast<int64_t>(mine.size()), (size + n - 1) / n) << "N=" << n;
      for (int64_t i : mine) ++counts[i];
    }
    const int64_t padding = (size + n - 1) / n * n - size;
    EXPECT_EQ(std::count(counts.begin(), counts.end(), 1), size - padding) << "N=" << n;
    EXPECT_EQ(std::count(counts.begin(), counts.end(), 2), padding) << "N=" << n;
  }
}

TEST(DistributedSampler, RanksTogetherReadTheSingleRankEpochInOrder) {
  const int64_t size = 24;  // a multiple of every N, so nothing is padded or cut
  const std::vector<int64_t> single = make(size, 1, 0, false).indices(5);
  for (int n : kWorldSizes) {
    EXPECT_THAT(interleave_ranks(size, n, false, 5), ElementsAreArray(single)) << "N=" << n;
    EXPECT_THAT(interleave_ranks(size, n, true, 5), ElementsAreArray(single)) << "N=" << n;
  }
}

TEST(DistributedSampler, ShuffledEpochIsAPermutation) {
  std::vector<int64_t> order = make(100, 1, 0, false).indices(0);
  std::vector<int64_t> identity(100);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_NE(order, identity);
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, identity);
}

TEST(DistributedSampler, SameSeedAndEpochGiveTheSameIndices) {
  EXPECT_EQ(make(50, 4, 2, false).indices(9), make(50, 4, 2, false).indices(9));
}

TEST(DistributedSampler, DifferentEpochsGiveDifferentOrders) {
  const DistributedSampler sampler = make(50, 1, 0, false);
  EXPECT_NE(sampler.indices(0), sampler.indices(1));
  EXPECT_NE(sampler.indices(1), sampler.indices(2));
}

TEST(DistributedSampler, DifferentSeedsGiveDifferentOrders) {
  EXPECT_NE(make(50, 1, 0, false, true, 1).indices(0), make(50, 1, 0, false, true, 2).indices(0));
}

TEST(DistributedSampler, ShuffleIsPinned) {
  // Checkpoints resume by (epoch, batch), so a change of order silently changes what a resumed run reads.
  // These orders come from an independent Python transcription of the algorithm the header documents:
  //   M = 2**64 - 1
  //   def sm(x):  # splitmix64
  //     x = (x + 0x9e3779b97f4a7c15) & M; x = ((x ^ x >> 30) * 0xbf58476d1ce4e5b9) & M
  //     x = ((x ^ x >> 27) * 0x94d049bb133111eb) & M; return x ^ x >> 31
  //   key, c, o = sm(sm(7) ^ epoch), 0, list(range(10))
  //   for i in range(9, 0, -1):  # Fisher-Yates from the top; draws >= M - M % (i+1) are redrawn
  //     while (x := sm((key + c) & M)) >= M - M % (i + 1): c += 1
  //     c += 1; j = x % (i + 1); o[i], o[j] = o[j], o[i]
  EXPECT_THAT(make(10, 1, 0, false).indices(0), ElementsAre(0, 8, 7, 3, 9, 1, 2, 4, 5, 6));
  EXPECT_THAT(make(10, 1, 0, false).indices(1), ElementsAre(8, 1, 3, 0, 6, 4, 7, 5, 9, 2));
}

TEST(DistributedSampler, InvalidRankIsAnError) {
  EXPECT_EQ(DistributedSampler::create(10, SamplerOptions{.world_size = 2, .rank = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DistributedSampler::create(10, SamplerOptions{.world_size = 0, .rank = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zero::data
