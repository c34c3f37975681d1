// The one way a GPU test skips: ZERO_SKIP_WITHOUT_GPU() at its top, in any build.
#pragma once

#include <gtest/gtest.h>

#include "runtime/device.h"

#define ZERO_SKIP_WITHOUT_GPU()                                                               \
  if (::zero::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible (or a build without CUDA)"
