// allocate_tensors: one accounted allocation carved into 64-byte-aligned views of each slot's dtype; check_on_device.
#include "models/unit_common.h"

#include <cstdint>

#include <gtest/gtest.h>

namespace zero {
namespace {

TEST(AllocateTensors, EachSlotIsItsDtypeAndStartsOn64Bytes) {
  Allocator alloc;
  Tensor half, stats, wide;
  absl::StatusOr<Buffer> buffer =
      allocate_tensors(alloc, MemoryCategory::kActivations, Device::cpu(),
                       {{&half, {3, 5}, DType::kBF16}, {&stats, {3}, DType::kF32}, {&wide, {2, 40}, DType::kF32}});
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(half.dtype(), DType::kBF16);
  EXPECT_EQ(half.shape(), (Shape{3, 5}));
  EXPECT_EQ(stats.dtype(), DType::kF32);
  EXPECT_EQ(wide.shape(), (Shape{2, 40}));
  const auto offset = [&](const Tensor& t) {
    return static_cast<char*>(t.data()) - static_cast<char*>(buffer->data());
  };
  // 15 bf16 elements (30 bytes) and 3 floats (12 bytes) each take 64; 80 floats take 320.
  EXPECT_EQ(offset(half), 0);
  EXPECT_EQ(offset(stats), 64);
  EXPECT_EQ(offset(wide), 128);
  EXPECT_EQ(alloc.stats().current_of(MemoryCategory::kActivations), 128 + 320);
}

TEST(CheckOnDevice, ATensorOnAnotherDeviceIsAnErrorNamingBoth) {
  float x = 0;
  const absl::Status status = check_on_device(Tensor(&x, DType::kF32, {1}), Device::cuda(0), "the inputs");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("the inputs is on cpu but the unit runs on cuda:0"), absl::string_view::npos)
      << status;
  EXPECT_TRUE(check_on_device(Tensor(&x, DType::kF32, {1}), Device::cpu(), "the inputs").ok());
}

}  // namespace
}  // namespace zero
