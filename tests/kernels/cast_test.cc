#include <cmath>

#include "kernel_test_util.h"
#include "kernels/kernels.h"
#include "runtime/cpu_threads.h"

namespace zero::kernels {
namespace {

using testing::random_floats;
using testing::view;

TEST(Cast, NearestEvenMatchesDtypeConversions) {
  std::vector<float> x = random_floats(1000, 1, -70000.0f, 70000.0f);
  x[0] = 1.0f + 1.0f / 256;  // a bf16 tie: rounds to even (1.0)
  std::vector<uint16_t> bf(1000), hf(1000);
  ASSERT_TRUE(cast(Tensor(bf.data(), DType::kBF16, {10, 100}), view(x, {10, 100})).ok());
  ASSERT_TRUE(cast(Tensor(hf.data(), DType::kF16, {1000}), view(x, {1000})).ok());
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(bf[i], float_to_bf16(x[i])) << i;
    EXPECT_EQ(hf[i], float_to_fp16(x[i])) << i;
  }
  EXPECT_EQ(bf16_to_float(bf[0]), 1.0f);
}

TEST(Cast, HalfToFloatIsExact) {
  std::vector<uint16_t> h(1 << 16);
  for (int i = 0; i < (1 << 16); ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> out(1 << 16);
  for (DType t : {DType::kBF16, DType::kF16}) {
    ASSERT_TRUE(cast(view(out, {1 << 16}), Tensor(h.data(), t, {1 << 16})).ok());
    for (int i = 0; i < (1 << 16); ++i) {
      const float want = load_as_float(h.data(), t, i);
      EXPECT_TRUE(out[i] == want || (std::isnan(out[i]) && std::isnan(want))) << t << " " << i;
    }
  }
}

// x sits 0.3 of the way from one bf16 (or fp16) neighbour to the next. Each stochastic result is one of
// the two neighbours, hi with probability 0.3, so the mean of M results has standard deviation
// ulp * sqrt(0.3 * 0.7 / M); with M = 2^16 that is 0.0018 ulp, and 0.01 ulp is over 5 sigma.
void expect_unbiased(DType t, float lo, float ulp) {
  constexpr int kM = 1 << 16;
  const float x = lo + 0.3f * ulp;
  std::vector<float> xs(kM, x);
  std::vector<uint16_t> h(kM);
  const StochasticRounding sr{.seed = 42, .step = 3, .index_offset = 0};
  ASSERT_TRUE(cast(Tensor(h.data(), t, {kM}), view(xs, {kM}), &sr).ok());
  double sum = 0;
  for (int i = 0; i < kM; ++i) {
    const float y = load_as_float(h.data(), t, i);
    ASSERT_TRUE(y == lo || y == lo + ulp) << y;
    sum += y;
  }
  EXPECT_NEAR(sum / kM, x, 0.01 * ulp) << t;
}

TEST(Cast, StochasticRoundingIsUnbiased) {
  expect_unbiased(DType::kBF16, 1.0f, 1.0f / 128);
  expect_unbiased(DType::kF16, 1.0f, 1.0f / 1024);
  expect_unbiased(DType::kF16, 0.0f, std::ldexp(1.0f, -24));  // the subnormal range
}

TEST(Cast, StochasticRoundingIsDeterministicPerSeedAndIndex) {
  std::vector<float> x = random_floats(5000, 2);
  std::vector<uint16_t> a(5000), b(5000), c(5000), shard(1000);
  const StochasticRounding sr{.seed = 7, .step = 0, .index_offset = 0};
  const StochasticRounding other{.seed = 8, .step = 0, .index_offset = 0};
  const StochasticRounding shard_sr{.seed = 7, .step = 0, .index_offset = 2000};
  set_cpu_threads(1);
  ASSERT_TRUE(cast(Tensor(a.data(), DType::kBF16, {5000}), view(x, {5000}), &sr).ok());
  set_cpu_threads(3);
  ASSERT_TRUE(cast(Tensor(b.data(), DType::kBF16, {5000}), view(x, {5000}), &sr).ok());
  set_cpu_threads(1);
  ASSERT_TRUE(cast(Tensor(c.data(), DType::kBF16, {5000}), view(x, {5000}), &other).ok());
  ASSERT_TRUE(
      cast(Tensor(shard.data(), DType::kBF16, {1000}), Tensor(x.data() + 2000, DType::kF32, {1000}), &shard_sr).ok());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(std::vector<uint16_t>(a.begin() + 2000, a.begin() + 3000), shard);
}

TEST(Cast, StochasticWideningIsInvalidArgument) {
  std::vector<uint16_t> h(4);
  std::vector<float> out(4);
  const StochasticRounding sr;
  EXPECT_EQ(cast(view(out, {4}), Tensor(h.data(), DType::kBF16, {4}), &sr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zero::kernels
