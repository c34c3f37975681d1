#include "runtime/tensor.h"

#include <vector>

#include <gtest/gtest.h>

namespace zero {
namespace {

TEST(Tensor, ContiguousStridesAreRowMajor) {
  std::vector<float> data(24);
  Tensor t(data.data(), DType::kF32, {2, 3, 4});
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.device(), Device::cpu());
}

TEST(Tensor, ViewsPointIntoTheFlatBuffer) {
  std::vector<float> flat(10);
  Tensor buffer(flat.data(), DType::kF32, {10});
  Tensor w = buffer.view(2, {2, 3});  // elements 2..7
  EXPECT_EQ(w.data_as<float>(), flat.data() + 2);
  EXPECT_EQ(w.shape(), (Shape{2, 3}));
  w.data_as<float>()[5] = 7.0f;
  EXPECT_EQ(flat[7], 7.0f);
  Tensor s = buffer.slice(8, 10);
  EXPECT_EQ(s.data_as<float>(), flat.data() + 8);
  EXPECT_EQ(s.numel(), 2);
  EXPECT_EQ(w.flat().shape(), (Shape{6}));
}

TEST(Tensor, ViewOffsetsCountElementsOfItsDtype) {
  std::vector<uint16_t> flat(8);
  Tensor half(flat.data(), DType::kBF16, {8});
  EXPECT_EQ(half.view(3, {5}).data(), static_cast<void*>(flat.data() + 3));
}

TEST(Tensor, ByteRangesOverlapWhereTheyShareAByte) {
  char buffer[16] = {};
  EXPECT_TRUE(bytes_overlap(buffer, 8, buffer + 7, 8));
  EXPECT_TRUE(bytes_overlap(buffer + 4, 2, buffer, 16));  // one inside the other
  EXPECT_FALSE(bytes_overlap(buffer, 8, buffer + 8, 8));  // adjacent
  EXPECT_FALSE(bytes_overlap(buffer + 8, 8, buffer, 8));
  EXPECT_FALSE(bytes_overlap(buffer + 4, 0, buffer, 16));  // an empty range shares nothing
}

TEST(Tensor, StridedTensorIsNotContiguous) {
  std::vector<float> data(6);
  Tensor transposed(data.data(), DType::kF32, {3, 2}, {1, 3}, Device::cpu());
  EXPECT_FALSE(transposed.is_contiguous());
}

TEST(Tensor, ZeroSizedDimensions) {
  Tensor empty(nullptr, DType::kF32, {0, 5});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.defined());
  EXPECT_EQ(empty.to_string(), "Tensor(fp32(0, 5) on cpu)");
}

TEST(TensorDeathTest, ViewPastTheEndIsAProgrammerError) {
  std::vector<float> flat(4);
  Tensor buffer(flat.data(), DType::kF32, {4});
  EXPECT_DEATH(buffer.view(2, {3}), "overruns");
}

}  // namespace
}  // namespace zero
