#include <cmath>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/kernels.h"

namespace zero::kernels {
namespace {

using testing::kU32;
using testing::random_floats;
using testing::view;

constexpr int64_t kB = 2, kT = 5, kNH = 2, kHS = 3, kC = kNH * kHS;

// Naive fp64 causal attention: per (b, h), out_i = sum_{j<=i} softmax_j(q_i . k_j / sqrt(hs)) v_j.
std::vector<double> reference_attention(const std::vector<double>& inp, std::vector<double>* lse = nullptr) {
  std::vector<double> out(kB * kT * kC);
  if (lse != nullptr) lse->assign(kB * kNH * kT, 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t e) {
    return inp[(b * kT + t) * 3 * kC + part * kC + h * kHS + e];
  };
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t h = 0; h < kNH; ++h) {
      for (int64_t i = 0; i < kT; ++i) {
        std::vector<double> s(i + 1);
        double m = -INFINITY, z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < kHS; ++e) s[j] += at(b, i, 0, h, e) * at(b, j, 1, h, e) / std::sqrt(double{kHS});
          m = std::max(m, s[j]);
        }
        for (int64_t j = 0; j <= i; ++j) z += std::exp(s[j] - m);
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < kHS; ++e)
            out[(b * kT + i) * kC + h * kHS + e] += std::exp(s[j] - m) / z * at(b, j, 2, h, e);
        }
        if (lse != nullptr) (*lse)[(b * kNH + h) * kT + i] = m + std::log(z);
      }
    }
  }
  return out;
}

struct Forward {
  std::vector<float> out, lse;
};

Forward run_forward(std::vector<float>& inp) {
  Forward f{std::vector<float>(kB * kT * kC), std::vector<float>(kB * kNH * kT)};
  EXPECT_TRUE(
      attention_forward(view(f.out, {kB, kT, kC}), view(f.lse, {kB, kNH, kT}), view(inp, {kB, kT, 3 * kC}), kNH).ok());
  return f;
}

// Inputs in [-1, 1], hs = 3: scores below 2, softmax weights in (0, 1] summing to 1 over at most T = 5
// terms: every output is an fp32 convex combination with O(T + hs) roundings of O(1) values.
constexpr double kTol = 64 * kU32;

TEST(Attention, ForwardMatchesNaiveSoftmaxReference) {
  std::vector<float> inp = random_floats(kB * kT * 3 * kC, 1);
  const Forward f = run_forward(inp);
  std::vector<double> lse;
  const std::vector<double> out = reference_attention(testing::to_double(inp), &lse);
  testing::expect_near_all(f.out, out, kTol, "out");
  testing::expect_near_all(f.lse, lse, kTol, "lse");
}

TEST(Attention, LargeScoresStayFiniteAndAccurate) {
  std::vector<float> inp = random_floats(kB * kT * 3 * kC, 2);
  for (size_t i = 0; i < inp.size(); ++i) inp[i] *= (i / kC) % 3 == 2 ? 1.0f : 60.0f;  // q, k large; v O(1)
  const Forward f = run_forward(inp);
  for (float x : f.out) ASSERT_TRUE(std::isfinite(x));
  // Scores reach ~6000; the weights' relative error grows with |score| u, so the tolerance scales by 6000.
  testing::expect_near_all(f.out, reference_attention(testing::to_double(inp)), 6000 * kTol, "out");
}

TEST(Attention, FutureTokensDoNotChangeEarlierOutputs) {
  std::vector<float> inp = random_floats(kB * kT * 3 * kC, 3);
  const Forward before = run_forward(inp);
  constexpr int64_t kChanged = 3;
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t c = 0; c < 3 * kC; ++c) inp[(b * kT + kChanged) * 3 * kC + c] += 0.5f;
  }
  const Forward after = run_forward(inp);
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t t = 0; t < kT; ++t) {
      for (int64_t c = 0; c < kC; ++c) {
        const int64_t i = (b * kT + t) * kC + c;
        if (t < kChanged) {
          EXPECT_EQ(after.out[i], before.out[i]) << b << "," << t << "," << c;
        } else if (t == kChanged && c == 0) {
          EXPECT_NE(after.out[i], before.out[i]);  // the change does reach its own position
        }
      }
    }
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  std::vector<float> inp = random_floats(kB * kT * 3 * kC, 4), dout = random_floats(kB * kT * kC, 5);
  Forward f = run_forward(inp);
  std::vector<float> dinp(inp.size(), 9.0f);  // written, not added
  ASSERT_TRUE(attention_backward(view(dinp, {kB, kT, 3 * kC}), view(dout, {kB, kT, kC}), view(inp, {kB, kT, 3 * kC}),
                                 view(f.out, {kB, kT, kC}), view(f.lse, {kB, kNH, kT}), kNH)
                  .ok());
  const auto expected = testing::numeric_grad(
      testing::to_double(inp), [&](const auto& x) { return testing::weighted_sum(reference_attention(x), dout); });
  testing::expect_near_all(dinp, expected, kTol, "dinp");
}

TEST(Attention, HeadsNotDividingChannelsIsInvalidArgument) {
  std::vector<float> inp(kB * kT * 3 * kC), out(kB * kT * kC), lse(kB * 4 * kT);
  EXPECT_EQ(attention_forward(view(out, {kB, kT, kC}), view(lse, {kB, 4, kT}), view(inp, {kB, kT, 3 * kC}), 4).code(),
            absl::StatusCode::kInvalidArgument);
}

// bf16 and fp16: the fp32 kernels' bits on the widened tensors, each result rounded once; lse stays fp32.
class AttentionInHalf : public ::testing::TestWithParam<DType> {};

TEST_P(AttentionInHalf, GivesTheFp32BitsRounded) {
  const DType half = GetParam();
  const int64_t b = 2, t = 9, nh = 2, hs = 4, c = nh * hs;
  const std::vector<float> inp = random_floats(b * t * 3 * c, 41), out = random_floats(b * t * c, 42);
  const std::vector<float> dout = random_floats(b * t * c, 43), dinp = random_floats(b * t * 3 * c, 44);
  const std::vector<float> lse = random_floats(b * nh * t, 45, 1.0f, 2.0f);
  SCOPED_TRACE(dtype_name(half));
  using testing::expect_half_gives_the_fp32_bits_rounded;
  expect_half_gives_the_fp32_bits_rounded(half, {{out, {b, t, c}}, {lse, {b, nh, t}, true}, {inp, {b, t, 3 * c}}},
                                          [](const auto& x) { return attention_forward(x[0], x[1], x[2], nh); });
  expect_half_gives_the_fp32_bits_rounded(
      half, {{dinp, {b, t, 3 * c}}, {dout, {b, t, c}}, {inp, {b, t, 3 * c}}, {out, {b, t, c}}, {lse, {b, nh, t}, true}},
      [](const auto& x) { return attention_backward(x[0], x[1], x[2], x[3], x[4], nh); });
}

INSTANTIATE_TEST_SUITE_P(Bf16AndFp16, AttentionInHalf, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace zero::kernels
