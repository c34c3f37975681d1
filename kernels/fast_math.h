// Vectorizable fp32 math for the CPU kernels: no branches or library calls, so loops over buffers use SIMD.
#pragma once

#include <algorithm>

namespace zero::kernels::detail {

// tanh(x) as the [13/6] odd rational function Eigen uses for float: within 7 ulps of glibc's tanhf on
// [-10, 10] (tests/kernels/elementwise_test.cc measures it). Beyond |x| = 7.9053, tanh rounds to ±1 in
// fp32, so x is clamped there; NaN stays NaN. Vectorizes with -fno-trapping-math (zero_kernels' flags).
inline float tanh_rational(float x) {
  const float c = std::min(std::max(x, -7.90531110763549805f), 7.90531110763549805f);
  const float x2 = c * c;
  float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = x2 * p + -8.60467152213735e-11f;
  p = x2 * p + 5.12229709037114e-08f;
  p = x2 * p + 1.48572235717979e-05f;
  p = x2 * p + 6.37261928875436e-04f;
  p = x2 * p + 4.89352455891786e-03f;
  float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = x2 * q + 2.26843463243900e-03f;
  q = x2 * q + 4.89352518554385e-03f;
  return c * p / q;
}

}  // namespace zero::kernels::detail
