// Counter-based random numbers for the data pipeline: the same (seed, counter) gives the same value on every rank and
// platform.
#pragma once

#include <cstdint>

#include "runtime/splitmix64.h"

namespace zero::data {

// A sequential generator: the n-th draw is splitmix64(splitmix64(key) + n), fixed by the key alone. The key is
// mixed first so that nearby keys (seed ^ epoch, seed + example) start far-apart, non-overlapping streams.
class CounterRng {
 public:
  explicit constexpr CounterRng(uint64_t key) : key_(splitmix64(key)) {}
  constexpr uint64_t next() { return splitmix64(key_ + counter_++); }
  // Uniform in [0, bound), bound > 0, without modulo bias (draws above the largest multiple of bound are redrawn).
  constexpr uint64_t below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x = next();
    while (x >= limit) x = next();
    return x % bound;
  }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace zero::data
