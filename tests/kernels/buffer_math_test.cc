// add_into, divide_by and fill_zero give bitwise the per-element runtime/dtype.h reference in every dtype.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/kernels.h"

namespace zero::kernels {
namespace {

using testing::random_floats;
using testing::view;

constexpr DType kFloatingDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// Bytes of n elements of one dtype, filled from fp32 values by store_from_float.
struct HostBuffer {
  HostBuffer(DType dtype, const std::vector<float>& values) : dtype(dtype), bytes(values.size() * dtype_size(dtype)) {
    for (size_t i = 0; i < values.size(); ++i) store_from_float(bytes.data(), dtype, i, values[i]);
  }
  int64_t numel() const { return static_cast<int64_t>(bytes.size() / dtype_size(dtype)); }
  Tensor tensor() { return Tensor(bytes.data(), dtype, {numel()}); }

  DType dtype;
  std::vector<unsigned char> bytes;
};

// Over three blocks of the CPU split, with the values a gradient can hold at the edges of the formats:
// NaN, infinities, signed zeros, fp32 and fp16 subnormals, fp16 overflow.
std::vector<float> gradient_values(uint32_t seed) {
  std::vector<float> v = random_floats(3 * (1 << 14) + 5, seed, -3.0f, 3.0f);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            0.0f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min(),
                            3e-8f,
                            70000.0f,
                            -65504.0f,
                            1e-30f};
  for (size_t i = 0; i < std::size(specials); ++i) v[7 * i + seed % 7] = specials[i];
  return v;
}

// x[i] = rounded(op(x[i], other[i])) one element at a time through runtime/dtype.h.
HostBuffer reference(const HostBuffer& x, const HostBuffer& other, const std::function<float(float, float)>& op) {
  HostBuffer want = x;
  for (int64_t i = 0; i < x.numel(); ++i) {
    store_from_float(want.bytes.data(), x.dtype, i,
                     op(load_as_float(x.bytes.data(), x.dtype, i), load_as_float(other.bytes.data(), x.dtype, i)));
  }
  return want;
}

TEST(BufferMath, AddIntoRoundsOnceToEveryDtype) {
  for (DType t : kFloatingDTypes) {
    HostBuffer dst(t, gradient_values(1)), src(t, gradient_values(2));
    const HostBuffer want = reference(dst, src, [](float a, float b) { return a + b; });
    ASSERT_TRUE(add_into(dst.tensor(), src.tensor()).ok()) << t;
    EXPECT_EQ(dst.bytes, want.bytes) << t;
  }
}

TEST(BufferMath, DivideByIsADivisionInEveryDtype) {
  for (DType t : kFloatingDTypes) {
    for (float divisor : {3.0f, 0.1f, 8.0f, 0.0f}) {
      HostBuffer x(t, gradient_values(3));
      const HostBuffer want = reference(x, x, [divisor](float a, float) { return a / divisor; });
      ASSERT_TRUE(divide_by(x.tensor(), divisor).ok()) << t;
      EXPECT_EQ(x.bytes, want.bytes) << t << " / " << divisor;
    }
  }
}

// Division by d and multiplication by 1/d differ in the last bit for some values; the engine divides.
TEST(BufferMath, DivideByDiffersFromMultiplyingByTheReciprocal) {
  std::vector<float> divided = random_floats(1000, 5), multiplied = divided;
  ASSERT_TRUE(divide_by(view(divided, {1000}), 3.0f).ok());
  for (float& x : multiplied) x *= 1.0f / 3.0f;
  EXPECT_NE(divided, multiplied);
}

// The engine divides the gradients by ranks x accumulation steps, 1 on one rank: no pass then. A division would quiet
// a signaling NaN; x keeps its bits instead, in every dtype.
TEST(BufferMath, DividingByOneLeavesEveryBitAsItWas) {
  const std::vector<uint32_t> fp32 = {0x7f800001u, 0x3fc00000u};  // a signaling NaN, 1.5
  const std::vector<uint16_t> half = {0x7f81u, 0x7c01u};          // signaling NaNs: bf16's, fp16's
  std::vector<uint32_t> x32 = fp32;
  std::vector<uint16_t> x16 = half;
  ASSERT_TRUE(divide_by(Tensor(x32.data(), DType::kF32, {2}), 1.0f).ok());
  ASSERT_TRUE(divide_by(Tensor(x16.data(), DType::kBF16, {1}), 1.0f).ok());
  ASSERT_TRUE(divide_by(Tensor(x16.data() + 1, DType::kF16, {1}), 1.0f).ok());
  EXPECT_EQ(x32, fp32);
  EXPECT_EQ(x16, half);
}

TEST(BufferMath, NanAndInfinityPropagate) {
  std::vector<float> x = {1.0f, std::numeric_limits<float>::infinity(), 2.0f};
  std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN(), 1.0f, 1.0f};
  ASSERT_TRUE(add_into(view(x, {3}), view(nan, {3})).ok());
  EXPECT_TRUE(std::isnan(x[0]));
  EXPECT_EQ(x[1], std::numeric_limits<float>::infinity());
  ASSERT_TRUE(divide_by(view(x, {3}), 0.0f).ok());
  EXPECT_TRUE(std::isnan(x[0]));
  EXPECT_EQ(x[2], std::numeric_limits<float>::infinity());
}

TEST(BufferMath, FillZeroClearsEveryByte) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kU8}) {
    std::vector<unsigned char> bytes(4096, 0xab);
    const int64_t n = static_cast<int64_t>(bytes.size() / dtype_size(t));
    ASSERT_TRUE(fill_zero(Tensor(bytes.data(), t, {n})).ok()) << t;
    EXPECT_EQ(bytes, std::vector<unsigned char>(4096, 0)) << t;
  }
}

// The engine's copy of gradient bytes is cast() between equal dtypes.
TEST(BufferMath, CastBetweenEqualDtypesCopiesTheBits) {
  HostBuffer src(DType::kF16, gradient_values(6)), dst(DType::kF16, std::vector<float>(src.numel()));
  ASSERT_TRUE(cast(dst.tensor(), src.tensor()).ok());
  EXPECT_EQ(dst.bytes, src.bytes);
}

TEST(BufferMath, MismatchedOrNonFloatingArgumentsAreRefused) {
  std::vector<float> a(8), b(6);
  std::vector<uint16_t> h(8);
  std::vector<int32_t> ints(8);
  EXPECT_EQ(add_into(view(a, {8}), view(b, {6})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(add_into(view(a, {8}), Tensor(h.data(), DType::kBF16, {8})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(divide_by(view(ints, {8}), 2.0f).code(), absl::StatusCode::kInvalidArgument);
  const Tensor strided(a.data(), DType::kF32, {4}, {2}, Device::cpu());
  EXPECT_EQ(divide_by(strided, 2.0f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_zero(strided).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zero::kernels
