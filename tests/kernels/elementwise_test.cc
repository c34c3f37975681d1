#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/fast_math.h"
#include "kernels/kernels.h"

namespace zero::kernels {
namespace {

using testing::kU32;
using testing::random_floats;
using testing::view;

double reference_gelu(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}

std::vector<double> reference_gelu(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = reference_gelu(x[i]);
  return y;
}

// GELU's fp32 evaluation: a handful of roundings in the cubic and the product, and tanhf (a few ulps);
// |x| <= 4 keeps every intermediate below 2^5, so 64 u per unit of |x| bounds the error.
constexpr double kGeluTol = 4 * 64 * kU32;

TEST(TanhRational, WithinSevenUlpsOfTanhf) {
  // Every 2^-12 step of [-10, 10], and the tails: clamped to exactly +-1, NaN through.
  for (float x = -10.0f; x <= 10.0f; x += 0x1p-12f) {
    const float want = std::tanh(x);
    // ilogb(0) is INT_MIN: at tanh(0) = 0 the unit is the smallest subnormal.
    const float ulp = want == 0.0f ? std::numeric_limits<float>::denorm_min() : std::ldexp(1.0f, std::ilogb(want) - 23);
    ASSERT_LE(std::fabs(detail::tanh_rational(x) - want), 7 * ulp) << "x = " << x;
  }
  EXPECT_EQ(detail::tanh_rational(100.0f), 1.0f);
  EXPECT_EQ(detail::tanh_rational(-100.0f), -1.0f);
  EXPECT_TRUE(std::isnan(detail::tanh_rational(std::numeric_limits<float>::quiet_NaN())));
}

TEST(ExpPoly, WithinOneUlpOfTheRoundedExpAndExactAtTheEdges) {
  // Every 2^-10 step over the normal range; the reference is exp in fp64 rounded once to fp32.
  for (float x = -87.0f; x <= 88.0f; x += 0x1p-10f) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const float ulp = std::ldexp(1.0f, std::ilogb(want) - 23);
    ASSERT_LE(std::fabs(detail::exp_poly(x) - want), ulp) << "x = " << x;
  }
  EXPECT_EQ(detail::exp_poly(0.0f), 1.0f);
  EXPECT_EQ(detail::exp_poly(-INFINITY), 0.0f);
  EXPECT_EQ(detail::exp_poly(-100.0f), 0.0f);  // below 2^-126: flushed
  EXPECT_EQ(detail::exp_poly(INFINITY), INFINITY);
  EXPECT_EQ(detail::exp_poly(100.0f), INFINITY);
  EXPECT_TRUE(std::isnan(detail::exp_poly(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Gelu, ForwardMatchesReference) {
  std::vector<float> x = random_floats(1000, 1, -4.0f, 4.0f), y(1000);
  ASSERT_TRUE(gelu_forward(view(y, {10, 100}), view(x, {10, 100})).ok());
  testing::expect_near_all(y, reference_gelu(testing::to_double(x)), kGeluTol, "gelu");
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  std::vector<float> x = random_floats(200, 2, -4.0f, 4.0f), dout = random_floats(200, 3), dx(200);
  ASSERT_TRUE(gelu_backward(view(dx, {200}), view(x, {200}), view(dout, {200})).ok());
  const auto expected = testing::numeric_grad(
      testing::to_double(x), [&](const auto& v) { return testing::weighted_sum(reference_gelu(v), dout); });
  testing::expect_near_all(dx, expected, kGeluTol, "dinp");
}

TEST(Gelu, BackwardInPlaceOverDout) {
  std::vector<float> x = random_floats(64, 4), dout = random_floats(64, 5), separate(64);
  ASSERT_TRUE(gelu_backward(view(separate, {64}), view(x, {64}), view(dout, {64})).ok());
  ASSERT_TRUE(gelu_backward(view(dout, {64}), view(x, {64}), view(dout, {64})).ok());
  EXPECT_EQ(dout, separate);
}

TEST(Residual, ForwardAddsExactly) {
  std::vector<float> a = random_floats(100, 6), b = random_floats(100, 7), out(100);
  ASSERT_TRUE(residual_forward(view(out, {4, 25}), view(a, {4, 25}), view(b, {4, 25})).ok());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
}

TEST(Residual, BackwardAddsDoutIntoDinp) {
  std::vector<float> dinp = random_floats(100, 8), dout = random_floats(100, 9);
  const std::vector<float> before = dinp;
  ASSERT_TRUE(residual_backward(view(dinp, {100}), view(dout, {100})).ok());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(dinp[i], before[i] + dout[i]);
}

TEST(Residual, ShapeMismatchIsInvalidArgument) {
  std::vector<float> a(12), b(12), out(12);
  EXPECT_EQ(residual_forward(view(out, {3, 4}), view(a, {3, 4}), view(b, {4, 3})).code(),
            absl::StatusCode::kInvalidArgument);
}

// bf16 and fp16: each kernel gives the fp32 kernel's bits on the widened inputs, rounded once; in place too.
class ElementwiseInHalf : public ::testing::TestWithParam<DType> {};

TEST_P(ElementwiseInHalf, GivesTheFp32BitsRounded) {
  const DType half = GetParam();
  const int64_t n = 5000;  // a partial block of the threads' split
  const std::vector<float> x = random_floats(n, 11, -5.0f, 5.0f), g = random_floats(n, 12), y = random_floats(n, 13);
  using testing::expect_half_gives_the_fp32_bits_rounded;
  SCOPED_TRACE(dtype_name(half));
  expect_half_gives_the_fp32_bits_rounded(half, {{x, {n}}, {y, {n}}},
                                          [](const auto& t) { return gelu_forward(t[1], t[0]); });
  expect_half_gives_the_fp32_bits_rounded(half, {{x, {n}}, {g, {n}}, {y, {n}}},
                                          [](const auto& t) { return gelu_backward(t[2], t[0], t[1]); });
  expect_half_gives_the_fp32_bits_rounded(half, {{x, {n}}, {g, {n}}},
                                          [](const auto& t) { return gelu_backward(t[1], t[0], t[1]); });
  expect_half_gives_the_fp32_bits_rounded(half, {{x, {n}}, {g, {n}}, {y, {n}}},
                                          [](const auto& t) { return residual_forward(t[2], t[0], t[1]); });
  expect_half_gives_the_fp32_bits_rounded(half, {{x, {n}}, {g, {n}}},
                                          [](const auto& t) { return residual_backward(t[0], t[1]); });
}

INSTANTIATE_TEST_SUITE_P(Bf16AndFp16, ElementwiseInHalf, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Residual, MixedDtypesAreInvalidArgument) {
  std::vector<float> a(12), out(12);
  std::vector<uint16_t> b(12);
  const absl::Status s = residual_forward(view(out, {12}), view(a, {12}), Tensor(b.data(), DType::kBF16, {12}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("fp32"), std::string::npos) << s;
}

TEST(Gelu, IntegerTensorsAreInvalidArgument) {
  std::vector<int32_t> x(4), y(4);
  const absl::Status s = gelu_forward(view(y, {4}), view(x, {4}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("fp32, bf16 or fp16"), std::string::npos) << s;
}

}  // namespace
}  // namespace zero::kernels
