// CPU plumbing shared by the optimizers: a static OpenMP split over chunks, the gradients read as fp32 pieces, and the
// half-precision copy.
#pragma once

#include <algorithm>
#include <cstdint>

#include "optim/element_math.h"
#include "optim/optimizer.h"
#include "runtime/dtype.h"
#include "runtime/dtype_dispatch.h"
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

// fn(g, begin, end) over [chunk.begin, chunk.end) in pieces, g[i - begin] the fp32 gradient of shard element i as
// scaled_gradient gives it: the shard's own gradients where they are fp32 and nothing scales them, else each piece
// read into a buffer on the stack, sized to stay in the L1 cache.
inline constexpr int64_t kGradientPiece = 2048;
template <typename Fn>
void for_each_gradient_piece(const GradientRead& grads, const ShardChunk& chunk, Fn&& fn) {
  if (grads.dtype == DType::kF32 && grads.loss_scale == 1.0f && !(grads.clip < 1.0f)) {
    fn(static_cast<const float*>(grads.data) + chunk.begin, chunk.begin, chunk.end);
    return;
  }
  float piece[kGradientPiece];
  for (int64_t begin = chunk.begin; begin < chunk.end; begin += kGradientPiece) {
    const int64_t end = std::min(begin + kGradientPiece, chunk.end);
    visit_floating(grads.dtype, [&](auto t) {  // the dtype a constant, so the loop vectorizes
      constexpr DType T = decltype(t)::value;
      for (int64_t i = begin; i < end; ++i) piece[i - begin] = scaled_gradient(load_as_float(grads.data, T, i), grads);
    });
    fn(static_cast<const float*>(piece), begin, end);
  }
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
