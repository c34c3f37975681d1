#include "shard/init.h"

#include <cmath>

#include "runtime/splitmix64.h"

namespace zero {

namespace {

// A standard normal for element i: Box-Muller on two uniforms drawn from the element's counter.
float normal_at(uint64_t seed, uint64_t key, int64_t i) {
  const uint64_t h = splitmix64(seed ^ splitmix64(key ^ splitmix64(static_cast<uint64_t>(i))));
  const double u1 = (static_cast<double>(h >> 40) + 1.0) / 16777217.0;  // (0, 1]
  const double u2 = static_cast<double>(splitmix64(h) >> 40) / 16777216.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

uint64_t fnv1a(uint64_t h, absl::string_view bytes) {
  for (const char c : bytes) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

}  // namespace

uint64_t param_key(absl::string_view unit, absl::string_view param) {
  constexpr uint64_t kOffsetBasis = 0xcbf29ce484222325ull;
  return fnv1a(fnv1a(fnv1a(kOffsetBasis, unit), absl::string_view("\0", 1)), param);
}

void init_values(const Init& init, uint64_t seed, uint64_t key, int64_t begin, int64_t end, float* out) {
  for (int64_t i = begin; i < end; ++i) {
    switch (init.kind) {
      case Init::Kind::kZeros: out[i - begin] = 0.0f; break;
      case Init::Kind::kOnes: out[i - begin] = 1.0f; break;
      case Init::Kind::kNormal: out[i - begin] = init.std * normal_at(seed, key, i); break;
    }
  }
}

}  // namespace zero
