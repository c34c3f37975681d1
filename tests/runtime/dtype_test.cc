#include "runtime/dtype.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace zero {
namespace {

bool is_nan_fp16(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool is_nan_bf16(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

TEST(Fp16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float f = fp16_to_float(static_cast<uint16_t>(h));
    if (is_nan_fp16(static_cast<uint16_t>(h))) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(is_nan_fp16(float_to_fp16(f)));
    } else {
      ASSERT_EQ(float_to_fp16(f), h) << "half 0x" << std::hex << h;
    }
  }
}

// Between two neighbouring positive halves a < b: the midpoint goes to the even one, anything
// strictly nearer a goes to a and strictly nearer b goes to b.
TEST(Fp16, RoundsToNearestTiesToEven) {
  for (uint16_t a = 0; a < 0x7bffu; ++a) {
    const uint16_t b = a + 1;
    const float fa = fp16_to_float(a), fb = fp16_to_float(b);
    const float mid = (fa + fb) / 2;  // exact in fp32: halves have 11-bit significands
    EXPECT_EQ(float_to_fp16(mid), (a & 1u) ? b : a) << "between 0x" << std::hex << a << " and 0x" << b;
    EXPECT_EQ(float_to_fp16(std::nextafter(mid, fa)), a);
    EXPECT_EQ(float_to_fp16(std::nextafter(mid, fb)), b);
    EXPECT_EQ(float_to_fp16(-mid), static_cast<uint16_t>(((a & 1u) ? b : a) | 0x8000u));
  }
}

TEST(Fp16, OverflowAndSpecials) {
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bffu);
  EXPECT_EQ(float_to_fp16(65519.99f), 0x7bffu);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00u);  // the tie rounds to even: infinity
  EXPECT_EQ(float_to_fp16(1e10f), 0x7c00u);
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00u);
  EXPECT_EQ(float_to_fp16(1e-10f), 0x0000u);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000u);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001u);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000u);  // half of it: tie to even zero
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001u);
}

TEST(Bf16, EveryBf16RoundTripsThroughFloat) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (is_nan_bf16(static_cast<uint16_t>(h))) {
      EXPECT_TRUE(is_nan_bf16(float_to_bf16(f)));
    } else {
      ASSERT_EQ(float_to_bf16(f), h) << "bf16 0x" << std::hex << h;
    }
  }
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  for (uint16_t a = 0; a < 0x7f7fu; a += 3) {
    const uint16_t b = a + 1;
    const float fa = bf16_to_float(a), fb = bf16_to_float(b);
    const float mid = bits_float((float_bits(fa) + float_bits(fb)) / 2);  // same exponent or adjacent: exact
    EXPECT_EQ(float_to_bf16(mid), (a & 1u) ? b : a);
    EXPECT_EQ(float_to_bf16(std::nextafter(mid, fa)), a);
    EXPECT_EQ(float_to_bf16(std::nextafter(mid, fb)), b);
  }
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80u);  // rounds up to infinity
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI32), 4u);
  EXPECT_EQ(dtype_size(DType::kU16), 2u);
  EXPECT_EQ(dtype_size(DType::kU8), 1u);
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
}

}  // namespace
}  // namespace zero
