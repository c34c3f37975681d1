// Vectorizable fp32 math for the CPU kernels (tanh, exp): no branches or library calls, so loops over buffers use SIMD.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/vector_clones.h"

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

// exp(x) as Cephes' expf: x = n ln2 + r (ln2 split in two so r is exact), a degree-5 polynomial for
// e^r on |r| <= ln2/2, and 2^n put into the exponent bits: within 2 ulps of std::exp for normal results
// (tested). Results below 2^-126 flush to zero, x above 88.376 gives infinity, NaN stays NaN.
inline float exp_poly(float x) {
  constexpr float kHi = 88.3762626647949f, kLo = -88.3762626647949f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const float c = std::min(std::max(x, kLo), kHi);
  const float n_or_nan = (c * 1.44269504088896341f + kRound) - kRound;
  const float n = n_or_nan == n_or_nan ? n_or_nan : 0.0f;  // a NaN x is returned below
  const float r = (c - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e_r = p * r * r + r + 1.0f;
  const float two_n = bits_float(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);  // 0 for n = -127
  const float y = e_r * two_n;
  return x > kHi ? INFINITY : (x == x ? y : x);
}

// The fp64 sum of x[0, n) in a fixed order that does not chain every add on the last: eight lanes
// (element i into lane i % 8), then the lanes pairwise. The same bits on every call and thread count.
inline double sum_fp64(const float* x, int64_t n) {
  double lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) lanes[k] += x[i + k];
  }
  for (; i < n; ++i) lanes[i % 8] += x[i];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

}  // namespace zero::kernels::detail
