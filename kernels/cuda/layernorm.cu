// LayerNorm on CUDA in fp32, bf16 or fp16, with the residual add fused before it or its gradient after: a warp per row,
// column sums.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/cuda/half.cuh"
#include "runtime/dtype_dispatch.h"

namespace zero::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / kWarp;

// f(k, i, count) for the lane's k-th chunk of a row of c elements (its chunks lane, lane + 32, ..., common.cuh), the
// chunk at element i holding count of them. kHeld > 0 (a row of at most kWarp kChunk kHeld elements): a loop the
// compiler unrolls, so that an array indexed by k stays in registers; 0: a loop over any c.
template <int kHeld, typename F>
__device__ __forceinline__ void for_each_lane_chunk(int lane, int64_t c, F&& f) {
#pragma unroll
  for (int k = 0; kHeld == 0 || k < kHeld; ++k) {
    const int64_t i = (int64_t{lane} + int64_t{k} * kWarp) * kChunk;
    if (i >= c) break;
    f(k, i, chunk_count(i, c));
  }
}

// The chunks a lane keeps in registers (one, unused, where kHeld is 0).
template <int kHeld>
using LaneChunks = Chunk[kHeld > 0 ? kHeld : 1];

// The lane's k-th chunk, at element `at` of a T buffer p: held[k] where the lane keeps its chunks, else read again.
template <DType T, int kHeld>
__device__ __forceinline__ Chunk held_or_read(const LaneChunks<kHeld>& held, int k, const void* p, int64_t at,
                                              int64_t count) {
  if constexpr (kHeld > 0) return held[k];
  return load_chunk<T>(p, at, count);
}

// Chunks of a row of c elements a lane owns at most: GPT-2's C of 768 takes 3, its XL's 1600 7.
int64_t lane_chunks(int64_t c) { return (c + kWarp * kChunk - 1) / (kWarp * kChunk); }

// Two-pass mean and biased variance of one row, as the CPU version (not Welford), after inp += residual where one
// is given (each lane rounds its sum as stored and goes on with that). Lane l owns the row's chunks l, l + 32, ...
// (common.cuh), in every dtype the same. Every tensor but mean and rstd in T. kHeld > 0: the lane keeps its chunks
// in registers after the first read (rows of at most kWarp kChunk kHeld elements); 0: each pass reads them again.
template <DType T, int kHeld>
__global__ void layernorm_forward_kernel(void* out, float* mean, float* rstd, void* inp, const void* residual,
                                         const void* weight, const void* bias, int64_t n, int64_t c) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;
  const int64_t first = row * c;
  LaneChunks<kHeld> held = {};  // the lane's chunks as pass 1 left them
  float sum = 0.0f;
  for_each_lane_chunk<kHeld>(lane, c, [&](int k, int64_t i, int64_t count) {
    Chunk x = load_chunk<T>(inp, first + i, count);
    if (residual != nullptr) {
      const Chunk r = load_chunk<T>(residual, first + i, count);
      for (int e = 0; e < kChunk; ++e) x.x[e] = rounded<T>(x.x[e] + r.x[e]);
      store_chunk<T>(inp, first + i, count, x);
    }
    if constexpr (kHeld > 0) held[k] = x;
    for (const float v : x.x) sum += v;  // past the row's end, zeros
  });
  const float m = warp_sum(sum) / static_cast<float>(c);
  float sq = 0.0f;
  for_each_lane_chunk<kHeld>(lane, c, [&](int k, int64_t i, int64_t count) {
    const Chunk x = held_or_read<T, kHeld>(held, k, inp, first + i, count);
    for (int e = 0; e < kChunk; ++e) {  // a constant bound keeps the chunk in registers
      if (e < count) sq += (x.x[e] - m) * (x.x[e] - m);
    }
  });
  const float s = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(c) + kLayerNormEps);
  for_each_lane_chunk<kHeld>(lane, c, [&](int k, int64_t i, int64_t count) {
    Chunk x = held_or_read<T, kHeld>(held, k, inp, first + i, count);
    const Chunk w = load_chunk<T>(weight, i, count), b = load_chunk<T>(bias, i, count);
    for (int e = 0; e < kChunk; ++e) x.x[e] = (x.x[e] - m) * s * w.x[e] + b.x[e];
    store_chunk<T>(out, first + i, count, x);
  });
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * weight, per row, + dresidual where
// given: added in fp32 and stored rounded once. Lane l owns the row's chunks l, l + 32, ..., as in the forward.
// kHeld > 0: the lane keeps dnorm and inp in registers after the first read (rows of at most kWarp kChunk kHeld
// elements); 0: the second pass reads dout, weight and inp again.
template <DType T, int kHeld>
__global__ void layernorm_backward_kernel(void* dinp, const void* dout, const void* inp, const void* weight,
                                          const float* mean, const float* rstd, const void* dresidual, int64_t n,
                                          int64_t c) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;
  const int64_t first = row * c;
  const float mu = mean[row], rs = rstd[row];
  LaneChunks<kHeld> held_dnorm = {}, held_x = {};  // the lane's dout * weight and inp, as pass 1 read them
  // The lane's k-th chunk, at element i, of dout * weight.
  const auto dnorm_at = [&](int k, int64_t i, int64_t count) {
    Chunk d = held_or_read<T, kHeld>(held_dnorm, k, dout, first + i, count);
    if constexpr (kHeld == 0) {
      const Chunk w = load_chunk<T>(weight, i, count);
      for (int e = 0; e < kChunk; ++e) d.x[e] *= w.x[e];
    }
    return d;
  };
  float dnorm_sum = 0.0f, dnorm_xhat_sum = 0.0f;
  for_each_lane_chunk<kHeld>(lane, c, [&](int k, int64_t i, int64_t count) {
    Chunk dnorm = load_chunk<T>(dout, first + i, count);
    const Chunk x = load_chunk<T>(inp, first + i, count), w = load_chunk<T>(weight, i, count);
    for (int e = 0; e < kChunk; ++e) dnorm.x[e] *= w.x[e];
    if constexpr (kHeld > 0) held_dnorm[k] = dnorm, held_x[k] = x;
    for (int e = 0; e < kChunk; ++e) {
      if (e >= count) continue;
      dnorm_sum += dnorm.x[e];
      dnorm_xhat_sum += dnorm.x[e] * (x.x[e] - mu) * rs;
    }
  });
  const float dnorm_mean = warp_sum(dnorm_sum) / static_cast<float>(c);
  const float dnorm_xhat_mean = warp_sum(dnorm_xhat_sum) / static_cast<float>(c);
  for_each_lane_chunk<kHeld>(lane, c, [&](int k, int64_t i, int64_t count) {
    const Chunk dnorm = dnorm_at(k, i, count);
    Chunk d = held_or_read<T, kHeld>(held_x, k, inp, first + i, count);
    const Chunk r = dresidual != nullptr ? load_chunk<T>(dresidual, first + i, count) : Chunk{};
    for (int e = 0; e < kChunk; ++e) {
      const float xhat = (d.x[e] - mu) * rs;
      const float v = (dnorm.x[e] - dnorm_mean - xhat * dnorm_xhat_mean) * rs;
      d.x[e] = dresidual != nullptr ? v + r.x[e] : v;
    }
    store_chunk<T>(dinp, first + i, count, d);
  });
}

// The weight's and the bias's gradient terms from one read of dout: dout * xhat and dout.
template <DType T>
struct DoutTimesXhatAndDout {
  static constexpr int kSums = 2;
  const void* dout;
  const void* inp;
  const float* mean;
  const float* rstd;
  int64_t c;
  __device__ void operator()(int64_t r, int64_t first, int64_t count, Chunk (&chunks)[2]) const {
    const Chunk g = load_chunk<T>(dout, r * c + first, count), x = load_chunk<T>(inp, r * c + first, count);
    const float mu = mean[r], rs = rstd[r];
    for (int e = 0; e < kChunk; ++e) chunks[0].x[e] = g.x[e] * ((x.x[e] - mu) * rs);
    chunks[1] = g;
  }
};

unsigned row_blocks(int64_t n) { return static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

absl::Status layernorm_forward(int device, void* out, float* mean, float* rstd, void* inp, const void* residual,
                               const void* weight, const void* bias, DType dtype, int64_t n, int64_t c) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  // A lane holds up to 8 chunks; wider rows are read in each pass.
  return visit_floating(dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    const auto kernel = lane_chunks(c) <= 4   ? layernorm_forward_kernel<T, 4>
                        : lane_chunks(c) <= 8 ? layernorm_forward_kernel<T, 8>
                                              : layernorm_forward_kernel<T, 0>;
    return launch_kernel(device, "layernorm_forward_kernel", kernel, row_blocks(n), kThreads, out, mean, rstd, inp,
                         residual, weight, bias, n, c);
  });
}

absl::Status layernorm_backward(int device, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                                const void* weight, const float* mean, const float* rstd, const void* dresidual,
                                DType dtype, int64_t n, int64_t c) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  return visit_floating(dtype, [&](auto t) -> absl::Status {
    constexpr DType T = decltype(t)::value;
    // Twice the forward's registers a chunk: a lane holds 4 chunks of each (rows up to 1024), or reads them again.
    const auto kernel = lane_chunks(c) <= 4 ? layernorm_backward_kernel<T, 4> : layernorm_backward_kernel<T, 0>;
    ZERO_RETURN_IF_ERROR(launch_kernel(device, "layernorm_backward_kernel", kernel, row_blocks(n), kThreads, dinp, dout,
                                       inp, weight, mean, rstd, dresidual, n, c));
    return add_column_sums<T>(device, n, c, {dweight, dbias}, DoutTimesXhatAndDout<T>{dout, inp, mean, rstd, c});
  });
}

}  // namespace zero::kernels::cuda
