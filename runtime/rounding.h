// Stochastic rounding of fp32 to bf16/fp16 and its random bits, one definition for host and device (casts and
// optimizers' half copies).
#pragma once

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/host_device.h"
#include "runtime/splitmix64.h"

namespace zero {

// Counter-based random bits for stochastic rounding: a function of (seed, step, flat index) only, so
// any sharding and thread count draws the same number for the same element (the high half of splitmix64).
ZERO_HD uint32_t rounding_bits(uint64_t seed, int64_t step, int64_t index) {
  return static_cast<uint32_t>(splitmix64(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step) +
                                          0xD1B54A32D192ED03ull * static_cast<uint64_t>(index)) >>
                               32);
}

// bf16 with stochastic rounding: rounds away from zero with probability equal to the distance from the
// truncated value in bf16 ulps (random low 16 bits added, then truncated). NaN and infinity stay so.
ZERO_HD uint16_t bf16_stochastic(float x, uint32_t r) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) >= 0x7f800000u) return static_cast<uint16_t>((u >> 16) | ((u & 0x7fffffu) ? 0x40u : 0u));
  return static_cast<uint16_t>((u + (r & 0xffffu)) >> 16);
}

// fp16 with stochastic rounding, the same rule as bf16: normal halves keep 10 of fp32's 23 mantissa bits,
// subnormal halves are multiples of 2^-24. Values that round past 65504 become infinity.
ZERO_HD uint16_t fp16_stochastic(float x, uint32_t r) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x38800000u) {  // |x| >= 2^-14: normal half unless it overflows
    a = (a + (r & 0x1fffu)) & ~0x1fffu;
    if (a >= 0x47800000u) return sign | 0x7c00u;
    return sign | static_cast<uint16_t>((a - 0x38000000u) >> 13);
  }
  const float scaled = bits_float(a) * 16777216.0f;  // |x| * 2^24, exact: scaling by a power of two
  const uint32_t whole = static_cast<uint32_t>(scaled);
  const float frac = scaled - static_cast<float>(whole);
  const float draw = static_cast<float>(r >> 8) * (1.0f / 16777216.0f);  // uniform in [0, 1), 24 bits
  return sign | static_cast<uint16_t>(whole + (draw < frac ? 1u : 0u));
}

}  // namespace zero
