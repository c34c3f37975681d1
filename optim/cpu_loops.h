// CPU plumbing shared by the optimizers: a static OpenMP split over chunks and the half-precision copy.
#pragma once

#include <cstdint>

#include "optim/element_math.h"
#include "optim/optimizer.h"
#include "runtime/dtype.h"
#include "runtime/rounding.h"

namespace zero::optim {

// fn(chunk_index, chunk) for every chunk of the shard, split statically over the OpenMP threads. Each
// element's result depends only on its own inputs, so the split never changes any bit.
template <typename Fn>
void for_each_chunk(const ShardLayout& layout, Fn&& fn) {
  const auto& chunks = layout.chunks();
  const int64_t n = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) fn(i, chunks[i]);
}

// Writes the low-precision copy of params[begin, end) (shard-local); `flat_begin` is the shard's offset
// in the flat buffer, so stochastic rounding draws the same bits under any sharding.
inline void write_half(const HalfCopy& half, const float* params, const ShardChunk& chunk, int64_t flat_begin,
                       int64_t step) {
  uint16_t* out = static_cast<uint16_t*>(half.out.data());
  const bool bf16 = half.out.dtype() == DType::kBF16;
  for (int64_t i = chunk.begin; i < chunk.end; ++i) {
    const float x = params[i];
    if (half.stochastic) {
      const uint32_t r = rounding_bits(half.seed, step, flat_begin + i);
      out[i] = bf16 ? bf16_stochastic(x, r) : fp16_stochastic(x, r);
    } else {
      out[i] = bf16 ? float_to_bf16(x) : float_to_fp16(x);
    }
  }
}

// for_each_chunk, then the chunk's half-precision copy while it is still in cache.
template <typename Fn>
void update_chunks(const ShardLayout& layout, const HalfCopy& half, const float* params, int64_t step, Fn&& fn) {
  for_each_chunk(layout, [&](int64_t i, const ShardChunk& chunk) {
    fn(i, chunk);
    if (half.enabled()) write_half(half, params, chunk, layout.shard_begin(), step);
  });
}

}  // namespace zero::optim
