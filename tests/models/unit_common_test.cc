// Fp32Views: fp32 views pass through without a copy; bf16/fp16 ones widen exactly and round back once; views
// must be on the unit's device.
#include "models/unit_common.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace zero {
namespace {

TEST(Fp32Views, Fp32ViewsPassThroughWithoutACopy) {
  std::vector<float> w = {1.5f, -2.0f};
  ParamViews views;
  views.set("w", Tensor(w.data(), DType::kF32, {2}));
  Allocator alloc;
  absl::StatusOr<Fp32Views> fp32 = Fp32Views::widen(alloc, Device::cpu(), views, {"w"});
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(fp32->views().at("w").data(), w.data());
  EXPECT_EQ(alloc.stats().peak_total, 0);
}

TEST(Fp32Views, ViewOnAnotherDeviceThanTheUnitIsAnError) {
  std::vector<uint16_t> w(2);
  ParamViews views;
  views.set("w", Tensor(w.data(), DType::kBF16, {2}, Device::cuda(0)));  // never read: refused first
  Allocator alloc;
  absl::StatusOr<Fp32Views> fp32 = Fp32Views::widen(alloc, Device::cpu(), views, {"w"});
  EXPECT_EQ(fp32.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fp32.status().message().find("the view 'w' is on cuda:0 but the unit runs on cpu"), absl::string_view::npos)
      << fp32.status();
  EXPECT_EQ(alloc.stats().peak_total, 0);
}

uint16_t to_half(DType half, float v) { return half == DType::kBF16 ? float_to_bf16(v) : float_to_fp16(v); }
float from_half(DType half, uint16_t h) { return half == DType::kBF16 ? bf16_to_float(h) : fp16_to_float(h); }

TEST(Fp32Views, HalfViewsWidenExactlyAndRoundBackOnce) {
  for (DType half : {DType::kBF16, DType::kF16}) {
    // 1 + 2^-5 and -3 are exact in both.
    const std::vector<float> values = {1.03125f, -3.0f};
    std::vector<uint16_t> grads(2);
    for (int i = 0; i < 2; ++i) grads[i] = to_half(half, values[i]);
    ParamViews views;
    views.set("g", Tensor(grads.data(), half, {2}));
    Allocator alloc;
    absl::StatusOr<Fp32Views> fp32 = Fp32Views::widen(alloc, Device::cpu(), views, {"g"});
    ASSERT_TRUE(fp32.ok()) << fp32.status();
    const Tensor g = fp32->views().at("g");
    ASSERT_EQ(g.dtype(), DType::kF32);
    EXPECT_EQ(g.data_as<float>()[0], values[0]);
    EXPECT_EQ(g.data_as<float>()[1], values[1]);
    EXPECT_EQ(alloc.stats().current_of(MemoryCategory::kWorkspace), 64) << "2 floats, 64-byte aligned";
    // Backward adds 0.3 ulp twice: in fp32 the sum reaches 0.6 ulp and rounds up to the next half value;
    // rounding after each addition would have dropped both.
    const float ulp = half == DType::kBF16 ? 1.0f / 128 : 1.0f / 1024;  // in [1, 2): 2^-7 and 2^-10
    g.data_as<float>()[0] += 0.3f * ulp;
    g.data_as<float>()[0] += 0.3f * ulp;
    ASSERT_TRUE(fp32->round_back().ok());
    EXPECT_EQ(from_half(half, grads[0]), values[0] + ulp) << dtype_name(half);
    EXPECT_EQ(from_half(half, grads[1]), values[1]) << dtype_name(half);
  }
}

}  // namespace
}  // namespace zero
