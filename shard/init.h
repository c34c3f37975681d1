// Parameter initialization that gives every element the same value however the buffer is partitioned.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

#include "shard/module.h"

namespace zero {

// Writes elements [begin, end) of a parameter initialized by `init` into out[0 .. end-begin). Element i
// is a pure function of (seed, key, i) — a counter-based generator — so a rank can produce just its
// shard and every stage and world size starts from bit-identical parameters.
void init_values(const Init& init, uint64_t seed, uint64_t key, int64_t begin, int64_t end, float* out);

// The key of a model's parameter: a stable hash (FNV-1a) of its unit and parameter names, so its
// values do not depend on how units are ordered or wrapped, nor on the process computing them.
uint64_t param_key(absl::string_view unit, absl::string_view param);

}  // namespace zero
