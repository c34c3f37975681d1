// Parameter initialization that gives every element the same value however the buffer is partitioned.
#pragma once

#include <cstdint>

#include "shard/module.h"

namespace zero {

// Writes elements [begin, end) of a parameter initialized by `init` into out[0 .. end-begin). Element i
// is a pure function of (seed, key, i) — a counter-based generator — so a rank can produce just its
// shard and every stage and world size starts from bit-identical parameters.
void init_values(const Init& init, uint64_t seed, uint64_t key, int64_t begin, int64_t end, float* out);

}  // namespace zero
