// The one way a GPU test skips: ZERO_SKIP_WITHOUT_GPU() at its top, in any build.
#pragma once

#include <cstdlib>
#include <string_view>

#include <gtest/gtest.h>

#include "runtime/device.h"

namespace zero::testing {
// ZERO_REQUIRE_GPU=1, set where a GPU is expected, turns the skip into a failure: a driver too old for
// the toolkit makes every CUDA call fail, and would otherwise pass off every GPU test as skipped.
inline bool gpu_required() {
  const char* required = std::getenv("ZERO_REQUIRE_GPU");
  return required != nullptr && std::string_view(required) == "1";
}
}  // namespace zero::testing

#define ZERO_SKIP_WITHOUT_GPU()                                                                            \
  if (::zero::cuda_device_count() == 0) {                                                                  \
    if (::zero::testing::gpu_required()) FAIL() << "ZERO_REQUIRE_GPU=1: " << ::zero::why_no_cuda_device(); \
    GTEST_SKIP() << ::zero::why_no_cuda_device();                                                          \
  }
