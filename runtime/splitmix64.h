// splitmix64, the one 64-bit mix behind zero's counter-based random numbers: initialization, generated data, stochastic
// rounding.
#pragma once

#include <cstdint>

#include "runtime/host_device.h"

namespace zero {

// The splitmix64 step: add the golden-ratio increment, then the finaliser, a bijective 64-bit mix, so
// distinct inputs never collide. A draw is a function of its counter alone, the same on every rank,
// thread count and device.
ZERO_HD constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace zero
