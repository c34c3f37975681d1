// Shared by the communicator suites: deterministic per-rank data and the reference reduction.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/comm/collective.h"
#include "runtime/dtype.h"

namespace zero::testing {

// `count` elements of `dtype` for `rank`, as raw bytes: varied signs and magnitudes, exactly
// representable in the dtype, different per rank and seed.
std::vector<uint8_t> rank_data(DType dtype, int64_t count, int rank, uint64_t seed = 1);

// Reference for a reduction across ranks: per element, combine inputs in rank order in fp32 (int32 wraps),
// round once. Written as plainly as possible; the backends must agree with it bit for bit.
std::vector<uint8_t> reference_reduce(const std::vector<std::vector<uint8_t>>& per_rank, DType dtype, int64_t count,
                                      ReduceOp op);

// The `chunk`-th block of `count` elements of a byte vector.
std::vector<uint8_t> chunk_of(const std::vector<uint8_t>& bytes, DType dtype, int64_t count, int chunk);

}  // namespace zero::testing
