// How the model tests measure a result against its reference: the largest error over the tensor's scale.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>

#include <gtest/gtest.h>

#include "runtime/tensor.h"

namespace zero::testing {

inline std::span<const float> floats_of(const Tensor& t) {
  return {t.data_as<float>(), static_cast<size_t>(t.numel())};
}

// max |got - want| / max |want|. Per element relative error is meaningless where a value is a
// cancellation near zero; fp32 rounding in a sum is proportional to the magnitudes summed, which the
// tensor's largest element stands for.
inline double max_relative_error(std::span<const float> got, std::span<const float> want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return diff / scale;
}

}  // namespace zero::testing
