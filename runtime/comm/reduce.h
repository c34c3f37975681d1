// The two data movements every backend is built from: a fixed-order reduction and a byte copy.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "runtime/comm/collective.h"

namespace zero {

// out[i] = op(in[0][i], in[1][i], ..., in[k-1][i]), combined left to right (rank order) in fp32 for the
// floating types (bf16/fp16 round once, at the end) and with wrap-around for int32; avg divides the
// fp32 sum by k. Max propagates NaN. `out` may alias any input. Fixed order makes results bitwise
// reproducible and identical however the elements are split across ranks.
// On a device, both functions queue their work on the calling thread's current stream and return without waiting
// for it: the caller orders it by events.
absl::Status reduce_in_rank_order(Device device, std::span<const void* const> inputs, void* out, int64_t count,
                                  DType dtype, ReduceOp op);

// memcpy on the host; a device-to-device copy on a device.
absl::Status queue_copy_bytes(Device device, void* dst, const void* src, int64_t nbytes);

}  // namespace zero
