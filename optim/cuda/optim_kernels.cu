#include "optim/cuda/optim_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/half.cuh"
#include "runtime/cuda/launch.cuh"
#include "runtime/device_memory.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/rounding.h"
#include "runtime/status.h"

namespace zero::optim {
namespace {

constexpr int kMaxSegments = 48;  // per launch; kernel parameters stay under 4 KiB
constexpr int kMaxGroups = 8;
constexpr int kThreads = 256;

constexpr int kSumTiles = 16;  // blocks per chunk in the square-sum pass: 16 * 256 threads, 16 elements each

// A parameter's part of the shard [begin, end) (shard-local), its group, and a per-parameter scale
// (LAMB/LARS: the step scaled by the trust ratio; the float fits the struct's padding).
struct Segment {
  int64_t begin;
  int64_t end;
  int32_t group;
  float scale;
};

// Passed by value as a kernel parameter, so no device allocation per step.
template <typename Coeffs>
struct Table {
  Segment segments[kMaxSegments];
  int32_t num_segments;
  Coeffs coeffs[kMaxGroups];
};

struct HalfOut {
  uint16_t* out;  // null: no copy
  bool bf16;
  bool stochastic;
  uint64_t seed;
  int64_t flat_begin;
  int64_t step;
};

// The segment holding shard element i, or -1 for padding and gaps (binary search over sorted segments).
template <typename Coeffs>
__device__ int find_segment(const Table<Coeffs>& t, int64_t i) {
  int lo = 0, hi = t.num_segments;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (t.segments[mid].begin <= i ? lo : hi) = mid;
  }
  return t.segments[lo].begin <= i && i < t.segments[lo].end ? lo : -1;
}

__device__ void write_half(const HalfOut& h, int64_t i, float x) {
  if (h.out == nullptr) return;
  if (h.stochastic) {
    const uint32_t r = rounding_bits(h.seed, h.step, h.flat_begin + i);
    h.out[i] = h.bf16 ? bf16_stochastic(x, r) : fp16_stochastic(x, r);
  } else {
    h.out[i] = h.bf16 ? to_bf16(x) : to_fp16(x);  // NaN bits as the CPU's
  }
}

// Elements a thread updates per pass of its grid-stride loop, all their loads issued before the first update: enough
// bytes in flight to keep the memory busy (Adam reads 14 bytes an element; one element a thread left an H200 near
// 3.2 TB/s).
constexpr int kElementsAtOnce = 4;

// One element's inputs, read before any of its batch is updated: the parameter, its gradient and up to two states.
struct ElementInputs {
  float p = 0, g = 0, state[2] = {0, 0};
};

// Grid-stride loop over the table's span, kElementsAtOnce elements a pass, thread-strided so a warp's loads stay
// coalesced: load(i) reads element i's ElementInputs, then update(i, inputs, coeffs, scale) stores its states and
// returns its new parameter, which goes to p and the half copy. The same operations per element as one at a time.
template <typename Coeffs, typename Load, typename Update>
__device__ void for_each_element(const Table<Coeffs>& t, float* p, const HalfOut& h, Load load, Update update) {
  const int64_t first = t.segments[0].begin, last = t.segments[t.num_segments - 1].end;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i0 = first + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i0 < last;
       i0 += kElementsAtOnce * threads) {
    int segment[kElementsAtOnce];
    ElementInputs in[kElementsAtOnce];
    for (int u = 0; u < kElementsAtOnce; ++u) {
      const int64_t i = i0 + u * threads;
      segment[u] = i < last ? find_segment(t, i) : -1;
      if (segment[u] >= 0) in[u] = load(i);
    }
    for (int u = 0; u < kElementsAtOnce; ++u) {
      if (segment[u] < 0) continue;
      const int64_t i = i0 + u * threads;
      const Segment& s = t.segments[segment[u]];
      const float x = update(i, in[u], t.coeffs[s.group], s.scale);
      p[i] = x;
      write_half(h, i, x);
    }
  }
}

// Square-sum pass over a table of chunks (one per blockIdx.y, kSumTiles blocks each): fn(i, coeffs) returns the
// two values of element i whose squares go to the chunk's exact bins, bins[(first_chunk + y) * 2 + q][slot].
// Integer atomics are exact and associative, so the bins equal the CPU's for any schedule.
template <typename Coeffs, typename Fn>
__device__ void bin_squares(const Table<Coeffs>& t, unsigned long long* bins, int64_t first_chunk, Fn fn) {
  __shared__ unsigned long long local[2 * kSquareSlots];
  for (int j = threadIdx.x; j < 2 * kSquareSlots; j += blockDim.x) local[j] = 0;
  __syncthreads();
  const Segment& s = t.segments[blockIdx.y];
  for (int64_t i = s.begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < s.end;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float2 x = fn(i, t.coeffs[s.group]);
    uint64_t amount;
    int slot = square_slot(x.x, amount);
    atomicAdd(&local[slot], static_cast<unsigned long long>(amount));
    slot = square_slot(x.y, amount);
    atomicAdd(&local[kSquareSlots + slot], static_cast<unsigned long long>(amount));
  }
  __syncthreads();
  unsigned long long* out = bins + (first_chunk + blockIdx.y) * 2 * kSquareSlots;
  for (int j = threadIdx.x; j < 2 * kSquareSlots; j += blockDim.x) {
    if (local[j] != 0) atomicAdd(&out[j], local[j]);
  }
}

// Gradient i as the update uses it (element_math.h's scaled_gradient of the stored value, widened).
__device__ float gradient_at(const GradientRead& g, int64_t i) {
  switch (g.dtype) {
    case DType::kBF16: return scaled_gradient(load_float<DType::kBF16>(g.data, i), g);
    case DType::kF16: return scaled_gradient(load_float<DType::kF16>(g.data, i), g);
    default: return scaled_gradient(load_float<DType::kF32>(g.data, i), g);
  }
}

__global__ void sgd_kernel(Table<SgdCoeffs> t, float* p, GradientRead g, float* buf, HalfOut h) {
  for_each_element(
      t, p, h,
      [&](int64_t i) {
        return ElementInputs{p[i], gradient_at(g, i), {buf != nullptr ? buf[i] : 0.0f, 0}};
      },
      [&](int64_t i, const ElementInputs& in, const SgdCoeffs& c, float) {
        float b = in.state[0];
        const float x = sgd_element(in.p, in.g, b, c);
        if (buf != nullptr) buf[i] = b;
        return x;
      });
}

__global__ void adam_kernel(Table<AdamCoeffs> t, float* p, GradientRead g, float* m, float* v, HalfOut h) {
  for_each_element(
      t, p, h,
      [&](int64_t i) {
        return ElementInputs{p[i], gradient_at(g, i), {m[i], v[i]}};
      },
      [&](int64_t i, const ElementInputs& in, const AdamCoeffs& c, float) {
        float mi = in.state[0], vi = in.state[1];
        const float x = adam_element(in.p, in.g, mi, vi, c);
        m[i] = mi;
        v[i] = vi;
        return x;
      });
}

// The same operations, in the same order, as the CPU norm passes of lamb.cc and lars.cc (optim/trust_ratio.h).
__global__ void lamb_sums_kernel(Table<LambCoeffs> t, unsigned long long* bins, int64_t first_chunk, const float* p,
                                 GradientRead g, float* m, float* v) {
  bin_squares(t, bins, first_chunk, [&](int64_t i, const LambCoeffs& c) {
    adam_moments(gradient_at(g, i), m[i], v[i], c.adam);
    return make_float2(p[i], lamb_direction(p[i], m[i], v[i], c.weight_decay, c.adam));
  });
}

__global__ void lamb_apply_kernel(Table<LambCoeffs> t, float* p, const float* m, const float* v, HalfOut h) {
  for_each_element(
      t, p, h,
      [&](int64_t i) {
        return ElementInputs{p[i], 0, {m[i], v[i]}};
      },
      [&](int64_t, const ElementInputs& in, const LambCoeffs& c, float neg_step) {
        return in.p + neg_step * lamb_direction(in.p, in.state[0], in.state[1], c.weight_decay, c.adam);
      });
}

__global__ void lars_sums_kernel(Table<LarsCoeffs> t, unsigned long long* bins, int64_t first_chunk, const float* p,
                                 GradientRead g) {
  bin_squares(t, bins, first_chunk, [&](int64_t i, const LarsCoeffs&) { return make_float2(p[i], gradient_at(g, i)); });
}

// Block b bins the squares of x[i] / divisor over chunk first_chunk + b (kMaxBinnedValues elements, so each
// slot fits uint64 as in the CPU's SquareBins) into bins[b][slot]. Integer atomics: the same bins on every run.
template <DType T>
__global__ void square_bins_kernel(const void* x, float divisor, int64_t n, int64_t first_chunk,
                                   unsigned long long* bins) {
  __shared__ unsigned long long local[kSquareSlots];
  for (int j = threadIdx.x; j < kSquareSlots; j += blockDim.x) local[j] = 0;
  __syncthreads();
  const int64_t begin = (first_chunk + blockIdx.x) * SquareBins::kMaxBinnedValues;
  const int64_t end = n - begin < SquareBins::kMaxBinnedValues ? n : begin + SquareBins::kMaxBinnedValues;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    uint64_t amount;
    const int slot = square_slot(load_float<T>(x, i) / divisor, amount);
    atomicAdd(&local[slot], static_cast<unsigned long long>(amount));
  }
  __syncthreads();
  for (int j = threadIdx.x; j < kSquareSlots; j += blockDim.x) bins[blockIdx.x * kSquareSlots + j] = local[j];
}

__global__ void lars_apply_kernel(Table<LarsCoeffs> t, float* p, GradientRead g, float* v, HalfOut h) {
  for_each_element(
      t, p, h,
      [&](int64_t i) {
        return ElementInputs{p[i], gradient_at(g, i), {v[i], 0}};
      },
      [&](int64_t i, const ElementInputs& in, const LarsCoeffs& c, float scaled_lr) {
        float vi = in.state[0];
        const float x = lars_element(in.p, in.g, vi, c.momentum, scaled_lr, c.weight_decay);
        v[i] = vi;
        return x;
      });
}

HalfOut half_out(const ShardLayout& layout, const ShardStep& s) {
  if (!s.half->enabled()) return HalfOut{nullptr, false, false, 0, 0, 0};
  return HalfOut{static_cast<uint16_t*>(s.half->out.data()),
                 s.half->out.dtype() == DType::kBF16,
                 s.half->stochastic,
                 s.half->seed,
                 layout.shard_begin(),
                 s.step};
}

// The shard's chunks as segments. Without `param_scale` (SGD, Adam) adjacent chunks of one group merge into
// one segment; with it, each chunk stays a segment (in layout order) carrying its parameter's scale.
std::vector<Segment> segments_of(const ShardLayout& layout, const std::vector<float>* param_scale) {
  std::vector<Segment> segments;
  for (const ShardChunk& c : layout.chunks()) {
    const int32_t group = layout.params()[c.param].group;
    if (param_scale == nullptr && !segments.empty() && segments.back().end == c.begin &&
        segments.back().group == group) {
      segments.back().end = c.end;
    } else {
      segments.push_back({c.begin, c.end, group, param_scale != nullptr ? (*param_scale)[c.param] : 0.0f});
    }
  }
  return segments;
}

// Calls `launch(table, blocks, first)` (an absl::Status) once per kMaxSegments segments (on the current
// stream, not waited for); `first` indexes the table's first segment in `segments`.
template <typename Coeffs, typename Launch>
absl::Status for_each_table(const std::vector<Segment>& segments, const std::vector<Coeffs>& coeffs, Launch launch) {
  if (coeffs.size() > kMaxGroups) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA optimizers take at most ", kMaxGroups, " parameter groups, got ", coeffs.size()));
  }
  for (size_t first = 0; first < segments.size(); first += kMaxSegments) {
    Table<Coeffs> t{};
    t.num_segments = static_cast<int32_t>(std::min<size_t>(kMaxSegments, segments.size() - first));
    std::copy_n(segments.begin() + first, t.num_segments, t.segments);
    std::copy(coeffs.begin(), coeffs.end(), t.coeffs);
    const int64_t span = t.segments[t.num_segments - 1].end - t.segments[0].begin;
    const int64_t per_block = int64_t{kThreads} * kElementsAtOnce;
    const int blocks = static_cast<int>(std::min<int64_t>((span + per_block - 1) / per_block, 65535));
    ZERO_RETURN_IF_ERROR(launch(t, blocks, static_cast<int64_t>(first)));
  }
  return absl::OkStatus();
}

// kSquareSlots device counters of at most kMaxBinnedValues values as the CPU's SquareBins.
SquareBins bins_of(const uint64_t* slots) {
  SquareBins b;
  std::copy_n(slots, 256, b.bins.begin());
  b.nan = static_cast<uint32_t>(slots[kNanSlot]);
  b.inf = static_cast<uint32_t>(slots[kInfSlot]);
  return b;
}

// Zeroes the bins, runs `launch(table, grid, first_chunk)` (an absl::Status) per table of chunks and queues the bins'
// copy to the host, all on the current stream, and returns their reader: SquareSums exactly as the CPU's
// SquareSum::add(SquareBins) builds them, once that copy is done (the reader waits for its event).
template <typename Coeffs, typename Launch>
absl::StatusOr<ChunkSumsReader> chunk_sums(int device, const ShardLayout& layout, const std::vector<Coeffs>& coeffs,
                                           const SquareBinsScratch& bins, Launch launch) {
  const size_t chunks = layout.chunks().size();
  if (chunks == 0) return ChunkSumsReader([]() -> absl::StatusOr<ChunkSquareSums> { return ChunkSquareSums(); });
  const size_t bytes = static_cast<size_t>(square_bins_bytes(layout));
  ZERO_RETURN_IF_ERROR(zero_on_current_stream(device, bins.device.data(), bytes));
  const std::vector<float> unused_scale(layout.params().size());  // one segment per chunk: bins are per chunk
  const std::vector<Segment> segments = segments_of(layout, &unused_scale);
  ZERO_RETURN_IF_ERROR(for_each_table(segments, coeffs, [&](const Table<Coeffs>& t, int, int64_t first) {
    return launch(t, dim3(kSumTiles, t.num_segments), static_cast<unsigned long long*>(bins.device.data()), first);
  }));
  const Stream stream = current_cuda_stream(device);
  ZERO_RETURN_IF_ERROR(cuda_api().copy_async(bins.host.data(), bins.device.data(), bytes, stream));
  const Event copied = bins.copied->get();
  ZERO_RETURN_IF_ERROR(cuda_api().record(copied, stream));
  return ChunkSumsReader(
      [chunks, copied, host = static_cast<const uint64_t*>(bins.host.data())]() -> absl::StatusOr<ChunkSquareSums> {
        ZERO_RETURN_IF_ERROR(cuda_api().synchronize(copied));  // a query, where the caller waited for the device
        ChunkSquareSums sums(chunks);
        for (size_t k = 0; k < chunks; ++k) {
          for (int q = 0; q < 2; ++q) sums[k][q].add(bins_of(&host[(2 * k + q) * kSquareSlots]));
        }
        return sums;
      });
}

}  // namespace

int64_t square_bins_bytes(const ShardLayout& layout) {
  return static_cast<int64_t>(layout.chunks().size()) * 2 * kSquareSlots * static_cast<int64_t>(sizeof(uint64_t));
}

absl::Status cuda_zero(int device, void* ptr, int64_t nbytes) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  return zero_on_current_stream(device, ptr, static_cast<size_t>(nbytes));
}

absl::Status sgd_cuda(int device, const ShardLayout& layout, const std::vector<SgdCoeffs>& coeffs, const ShardStep& s,
                      float* momentum_buffer) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  const HalfOut h = half_out(layout, s);
  return for_each_table(segments_of(layout, nullptr), coeffs, [&](const Table<SgdCoeffs>& t, int blocks, int64_t) {
    return launch_kernel(device, "sgd_kernel", sgd_kernel, blocks, kThreads, t, s.params, s.grads, momentum_buffer, h);
  });
}

absl::Status adam_cuda(int device, const ShardLayout& layout, const std::vector<AdamCoeffs>& coeffs, const ShardStep& s,
                       float* exp_avg, float* exp_avg_sq) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  const HalfOut h = half_out(layout, s);
  return for_each_table(segments_of(layout, nullptr), coeffs, [&](const Table<AdamCoeffs>& t, int blocks, int64_t) {
    return launch_kernel(device, "adam_kernel", adam_kernel, blocks, kThreads, t, s.params, s.grads, exp_avg,
                         exp_avg_sq, h);
  });
}

}  // namespace zero::optim

namespace zero::optim {

absl::StatusOr<ChunkSumsReader> lamb_sums_cuda(int device, const ShardLayout& layout,
                                               const std::vector<LambCoeffs>& coeffs, const ShardStep& s,
                                               float* exp_avg, float* exp_avg_sq, const SquareBinsScratch& bins) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  return chunk_sums(device, layout, coeffs, bins,
                    [&](const Table<LambCoeffs>& t, dim3 grid, unsigned long long* b, int64_t first) {
                      return launch_kernel(device, "lamb_sums_kernel", lamb_sums_kernel, grid, kThreads, t, b, first,
                                           s.params, s.grads, exp_avg, exp_avg_sq);
                    });
}

absl::Status lamb_apply_cuda(int device, const ShardLayout& layout, const std::vector<LambCoeffs>& coeffs,
                             const std::vector<float>& param_scale, const ShardStep& s, const float* exp_avg,
                             const float* exp_avg_sq) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  const HalfOut h = half_out(layout, s);
  return for_each_table(segments_of(layout, &param_scale), coeffs,
                        [&](const Table<LambCoeffs>& t, int blocks, int64_t) {
                          return launch_kernel(device, "lamb_apply_kernel", lamb_apply_kernel, blocks, kThreads, t,
                                               s.params, exp_avg, exp_avg_sq, h);
                        });
}

absl::StatusOr<ChunkSumsReader> lars_sums_cuda(int device, const ShardLayout& layout,
                                               const std::vector<LarsCoeffs>& coeffs, const ShardStep& s,
                                               const SquareBinsScratch& bins) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  return chunk_sums(device, layout, coeffs, bins,
                    [&](const Table<LarsCoeffs>& t, dim3 grid, unsigned long long* b, int64_t first) {
                      return launch_kernel(device, "lars_sums_kernel", lars_sums_kernel, grid, kThreads, t, b, first,
                                           s.params, s.grads);
                    });
}

absl::Status lars_apply_cuda(int device, const ShardLayout& layout, const std::vector<LarsCoeffs>& coeffs,
                             const std::vector<float>& param_scale, const ShardStep& s, float* momentum_buffer) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  const HalfOut h = half_out(layout, s);
  return for_each_table(segments_of(layout, &param_scale), coeffs,
                        [&](const Table<LarsCoeffs>& t, int blocks, int64_t) {
                          return launch_kernel(device, "lars_apply_kernel", lars_apply_kernel, blocks, kThreads, t,
                                               s.params, s.grads, momentum_buffer, h);
                        });
}

absl::StatusOr<SquareSum> exact_square_sum_cuda(int device, std::span<const Tensor> xs, float divisor,
                                                int64_t chunks_per_read) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  const auto chunks_of = [](const Tensor& x) {
    return (x.numel() + SquareBins::kMaxBinnedValues - 1) / SquareBins::kMaxBinnedValues;
  };
  int64_t total = 0;
  for (const Tensor& x : xs) total += chunks_of(x);
  SquareSum sum;
  const int64_t capacity = std::min(total, std::max<int64_t>(chunks_per_read, 1));
  if (capacity == 0) return sum;
  std::vector<uint64_t> host(static_cast<size_t>(capacity * kSquareSlots));
  const absl::Status status = with_scratch(device, host.size() * sizeof(uint64_t), [&](void* scratch) {
    auto* bins = static_cast<unsigned long long*>(scratch);
    int64_t filled = 0;  // chunks binned into `bins` and not yet read
    // Reads the bins filled so far and adds them to `sum`: the one wait for the host.
    const auto read = [&]() -> absl::Status {
      if (filled == 0) return absl::OkStatus();
      ZERO_RETURN_IF_ERROR(
          copy_bytes(host.data(), Device::cpu(), bins, Device::cuda(device), filled * kSquareSlots * sizeof(uint64_t)));
      for (int64_t k = 0; k < filled; ++k) sum.add(bins_of(&host[k * kSquareSlots]));
      filled = 0;
      return absl::OkStatus();
    };
    // Bins chunks [first, first + count) of `x` after those filled so far.
    const auto bin = [&](const Tensor& x, int64_t first, int64_t count) -> absl::Status {
      ZERO_RETURN_IF_ERROR(visit_floating(x.dtype(), [&](auto t) {
        return launch_kernel(device, "square_bins_kernel", square_bins_kernel<decltype(t)::value>,
                             static_cast<unsigned>(count), kThreads, x.data(), divisor, x.numel(), first,
                             bins + filled * kSquareSlots);
      }));
      filled += count;
      return absl::OkStatus();
    };
    absl::Status s;
    for (const Tensor& x : xs) {
      for (int64_t first = 0, chunks = chunks_of(x); first < chunks && s.ok();) {
        if (filled == capacity) s.Update(read());
        const int64_t count = std::min(chunks - first, capacity - filled);
        if (s.ok()) s.Update(bin(x, first, count));
        first += count;
      }
    }
    if (s.ok()) s.Update(read());
    return s;
  });
  if (!status.ok()) return status;
  return sum;
}

}  // namespace zero::optim
