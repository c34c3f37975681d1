// Shared by the kernel .cu files: launch geometry, the elementwise launch (through cuda_api(), on the current
// stream), warp reductions, deterministic column sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/half.cuh"
#include "runtime/cuda/launch.cuh"
#include "runtime/dtype_dispatch.h"
#include "runtime/status.h"

namespace zero::kernels::cuda {

inline constexpr int kThreads = 256;
inline constexpr int kWarp = 32;
inline constexpr int kMaxBlocks = 65535;  // grid-stride loops cover the rest

// Blocks of `threads` covering `work` items, at most kMaxBlocks (kernels loop with a grid stride).
inline int blocks_for(int64_t work, int threads = kThreads) {
  return static_cast<int>(std::clamp<int64_t>((work + threads - 1) / threads, 1, kMaxBlocks));
}

#define ZERO_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

// ---- Chunks: 8 elements, moved as one 16-byte vector in bf16/fp16 (two in fp32) ----
// Elementwise and row kernels walk their elements in chunks, chunk k being elements [kChunk k, kChunk k + kChunk) of
// its thread, so which thread sums which elements, and in what order, is the same in every dtype: a sum over half
// inputs gives the fp32 call's bits. A whole chunk at a 16-byte-aligned address moves as vectors; any other (a row's
// tail, a view at an odd offset) element by element, with the same values.
inline constexpr int kChunk = 8;

struct Chunk {
  float x[kChunk];
};

// Elements [first, first + count) of a T buffer widened to fp32 (count <= kChunk; the rest of the chunk 0).
template <DType T>
__device__ __forceinline__ Chunk load_chunk(const void* p, int64_t first, int64_t count) {
  using Element = DeviceElement<T>;
  const Element* src = static_cast<const Element*>(p) + first;
  Chunk c{};
  if (count == kChunk && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    if constexpr (T == DType::kF32) {
      const float4 a = reinterpret_cast<const float4*>(src)[0], b = reinterpret_cast<const float4*>(src)[1];
      c = Chunk{{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
    } else {
      const uint4 u = *reinterpret_cast<const uint4*>(src);
      const uint32_t words[4] = {u.x, u.y, u.z, u.w};
      for (int e = 0; e < kChunk; ++e) {  // little-endian: the lower half of a word is the earlier element
        const auto bits = static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2)));
        c.x[e] = T == DType::kBF16 ? from_bf16(bits) : from_fp16(bits);
      }
    }
  } else {
    for (int e = 0; e < kChunk; ++e) {  // a constant bound: c stays in registers
      if (e < count) c.x[e] = load_float<T>(p, first + e);
    }
  }
  return c;
}

// c's first `count` values stored into elements [first, first + count) of a T buffer, each rounded once.
template <DType T>
__device__ __forceinline__ void store_chunk(void* p, int64_t first, int64_t count, const Chunk& c) {
  using Element = DeviceElement<T>;
  Element* dst = static_cast<Element*>(p) + first;
  if (count == kChunk && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    if constexpr (T == DType::kF32) {
      reinterpret_cast<float4*>(dst)[0] = make_float4(c.x[0], c.x[1], c.x[2], c.x[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(c.x[4], c.x[5], c.x[6], c.x[7]);
    } else {
      uint32_t words[4];
      for (int w = 0; w < 4; ++w) {
        const float lo = c.x[2 * w], hi = c.x[2 * w + 1];
        words[w] = T == DType::kBF16 ? (uint32_t{to_bf16(lo)} | uint32_t{to_bf16(hi)} << 16)
                                     : (uint32_t{to_fp16(lo)} | uint32_t{to_fp16(hi)} << 16);
      }
      *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
    }
  } else {
    for (int e = 0; e < kChunk; ++e) {
      if (e < count) store_float<T>(p, first + e, c.x[e]);
    }
  }
}

// out[i] = op(in[i]) over one chunk, in fp32, each element rounded once (out may be in).
template <DType T, typename Op>
__device__ __forceinline__ void map_chunk(void* out, const void* in, int64_t first, int64_t count, Op op) {
  Chunk x = load_chunk<T>(in, first, count);
  for (float& v : x.x) v = op(v);
  store_chunk<T>(out, first, count, x);
}

// out[i] = op(a[i], b[i]) over one chunk, in fp32, each element rounded once (out may be a, or b where B is T): out and
// a in T, b in B.
template <DType T, DType B = T, typename Op>
__device__ __forceinline__ void combine_chunk(void* out, const void* a, const void* b, int64_t first, int64_t count,
                                              Op op) {
  Chunk x = load_chunk<T>(a, first, count);
  const Chunk y = load_chunk<B>(b, first, count);
  for (int e = 0; e < kChunk; ++e) x.x[e] = op(x.x[e], y.x[e]);
  store_chunk<T>(out, first, count, x);
}

inline int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

// How many of the chunk at element `first` lie before `end`: kChunk but at the end.
__device__ __forceinline__ int64_t chunk_count(int64_t first, int64_t end) {
  return end - first < kChunk ? end - first : int64_t{kChunk};
}

// f(first, count) for each chunk of [0, n) that this thread owns in a grid-stride loop over chunks.
template <typename F>
__device__ __forceinline__ void for_each_chunk(int64_t n, F&& f) {
  ZERO_GRID_STRIDE(k, (n + kChunk - 1) / kChunk) f(k * kChunk, chunk_count(k * kChunk, n));
}

// Makes `device` current, launches kernel(args..., n) over n elements, a thread per chunk (for_each_chunk), on its
// current stream, restores the device.
template <typename... Params>
absl::Status launch_elementwise(int device, const char* name, void (*kernel)(Params...), int64_t n, auto... args) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  return launch_kernel(device, name, kernel, blocks_for(chunks_of(n)), kThreads, args..., n);
}

// f(t, s) with t the buffer's dtype and s its second operand's, each a DTypeConstant: s is t, or fp32 (a GEMM's fp32
// product, matmul.cu's); any other operand dtype is an error naming `op`.
template <typename F>
absl::Status visit_with_operand(const char* op, DType dtype, DType operand, F&& f) {
  ZERO_CHECK(operand == dtype || operand == DType::kF32, op, ": second operand in ", dtype_name(dtype),
             " or fp32, not ", dtype_name(operand));
  return visit_floating(dtype, [&](auto t) -> absl::Status {
    if (operand == dtype) return f(t, t);
    return f(t, DTypeConstant<DType::kF32>{});
  });
}

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }

// fp32 -> T, round to nearest even (the identity for fp32), NaNs as the CPU rounds them (runtime/cuda/half.cuh).
template <typename T>
__device__ __forceinline__ T narrow(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __ushort_as_bfloat16(to_bf16(x));
  } else if constexpr (std::is_same_v<T, __half>) {
    return __ushort_as_half(to_fp16(x));
  } else {
    return x;
  }
}

// ---- Column sums: out[s] (cols) += sum over rows of term s, in fp64 and a fixed order ----
// Like runtime/parallel.h's add_column_sums, with no floating-point atomics: the same bits on every run on a GPU model.
// A term gives kSums sums per element, so that one read of a matrix feeds several (LayerNorm's dweight and dbias):
// term(r, first, count, chunks) sets chunks[s] to sum s's terms at row r, columns [first, first + count) (count <=
// kChunk, the rest 0).
//
// One launch. Block (x, y) takes columns [kSumCols x, kSumCols (x + 1)) of rows [y block_rows, (y + 1) block_rows).
// Thread (lane, group) owns the chunk of kChunk columns at kSumCols x + kChunk lane and the block's rows group, group +
// kSumGroups, ..., which it adds in order, loading kSumRowsAtOnce of them before adding any (so that enough bytes are
// in flight to keep the memory busy); the groups' sums are then added in a fixed tree. Alone in its column (one row
// block) the block adds the result to out; else it stores it into partial[s][y][col], and the last of the column's
// row blocks to finish (counted in arrivals[x]) adds the partials in order (add_partials).
inline constexpr int kSumLanes = 4;  // chunks across: a warp reads 8 rows' 64 contiguous bytes of a bf16 matrix
inline constexpr int kSumCols = kSumLanes * kChunk;
inline constexpr int kSumGroups = kThreads / kSumLanes;
// Blocks per SM, resident together (__launch_bounds__) and what the grid is sized to, and rows a thread loads before
// adding them: 4 blocks of 4 rows for one sum (64 registers a thread), 3 blocks of 1 row for two, whose 16 fp64
// accumulators would spill at 64 registers, and the terms of a second row at 80.
template <int kSums>
inline constexpr int kSumBlocksPerSm = kSums == 1 ? 4 : 3;
template <int kSums>
inline constexpr int kSumRowsAtOnce = kSums == 1 ? 4 : 1;

template <int kSums>
struct ColumnOutputs {
  void* out[kSums];
};

// out[col] = round(out[col] + total): the fp64 sum rounded to fp32, added in fp32, one rounding into Out.
template <DType Out>
__device__ __forceinline__ void add_column_total(void* out, int64_t col, double total) {
  store_float<Out>(out, col, load_float<Out>(out, col) + static_cast<float>(total));
}

// acc[s][e] += chunks[s].x[e].
template <int kSums>
__device__ __forceinline__ void add_chunks(double (&acc)[kSums][kChunk], const Chunk (&chunks)[kSums]) {
  for (int s = 0; s < kSums; ++s) {
    for (int e = 0; e < kChunk; ++e) acc[s][e] += chunks[s].x[e];
  }
}

// The last row block of column block x: a warp per (sum, column) of the block's, lane l adding row blocks l, l + 32,
// ... in order and the lanes then added in warp_sum's fixed tree. The partials are read from L2 (__ldcg), where the
// other blocks' stores are, past this SM's L1.
template <DType Out, int kSums>
__device__ void add_partials(int64_t cols, const double* partial, ColumnOutputs<kSums> out) {
  const int lane = threadIdx.x % kWarp;
  const int64_t blocks = gridDim.y;
  for (int w = threadIdx.x / kWarp; w < kSums * kSumCols; w += kThreads / kWarp) {
    const int s = w / kSumCols;
    const int64_t col = blockIdx.x * int64_t{kSumCols} + w % kSumCols;
    if (col >= cols) continue;
    double total = 0.0;
    for (int64_t b = lane; b < blocks; b += kWarp) total += __ldcg(&partial[(s * blocks + b) * cols + col]);
    total = warp_sum(total);
    if (lane == 0) add_column_total<Out>(out.out[s], col, total);
  }
}

template <DType Out, typename Term>
__global__ void __launch_bounds__(kThreads, kSumBlocksPerSm<Term::kSums>)
    column_sums_kernel(int64_t rows, int64_t cols, int64_t block_rows, Term term, ColumnOutputs<Term::kSums> out,
                       double* partial, unsigned* arrivals) {
  constexpr int kSums = Term::kSums;
  // Thread t's sums at [s][e][t], so a warp's 32 threads touch 32 consecutive doubles: no bank conflicts.
  __shared__ double groups[kSums][kChunk][kThreads];
  __shared__ bool last;
  const int lane = threadIdx.x % kSumLanes, group = threadIdx.x / kSumLanes;
  const int64_t first_col = blockIdx.x * int64_t{kSumCols} + lane * kChunk;
  const int64_t count = first_col < cols ? chunk_count(first_col, cols) : 0;
  const int64_t first_row = blockIdx.y * block_rows;
  const int64_t end_row = first_row + block_rows < rows ? first_row + block_rows : rows;
  double acc[kSums][kChunk] = {};
  if (count > 0) {
    constexpr int kAtOnce = kSumRowsAtOnce<kSums>;
    int64_t r = first_row + group;
    for (; r + (kAtOnce - 1) * kSumGroups < end_row; r += kAtOnce * kSumGroups) {
      Chunk terms[kAtOnce][kSums];
      for (int u = 0; u < kAtOnce; ++u) term(r + u * kSumGroups, first_col, count, terms[u]);
      for (int u = 0; u < kAtOnce; ++u) add_chunks(acc, terms[u]);
    }
    for (; r < end_row; r += kSumGroups) {
      Chunk terms[kSums];
      term(r, first_col, count, terms);
      add_chunks(acc, terms);
    }
  }
  for (int s = 0; s < kSums; ++s) {
    for (int e = 0; e < kChunk; ++e) groups[s][e][threadIdx.x] = acc[s][e];
  }
  __syncthreads();
  for (int half = kSumGroups / 2; half > 0; half /= 2) {  // group g takes in group g + half's sums
    if (group < half) {
      for (int s = 0; s < kSums; ++s) {
        for (int e = 0; e < kChunk; ++e) groups[s][e][threadIdx.x] += groups[s][e][threadIdx.x + half * kSumLanes];
      }
    }
    __syncthreads();
  }
  // Group 0 holds the block's sums: thread t < kSums kSumCols has sum t / kSumCols of column t % kSumCols.
  static_assert(kSums * kSumCols <= kThreads);
  const int s = threadIdx.x / kSumCols, within = threadIdx.x % kSumCols;
  const int64_t col = blockIdx.x * int64_t{kSumCols} + within;
  const bool mine = threadIdx.x < kSums * kSumCols && col < cols;
  const double total = mine ? groups[s][within % kChunk][within / kChunk] : 0.0;
  if (gridDim.y == 1) {
    if (mine) add_column_total<Out>(out.out[s], col, total);
    return;
  }
  if (mine) partial[(s * int64_t{gridDim.y} + blockIdx.y) * cols + col] = total;
  __threadfence();  // the partial visible device-wide before this block counts itself in
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&arrivals[blockIdx.x], 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // ordered after the count that found every other block in
  add_partials<Out, kSums>(cols, partial, out);
}

// The plain column sum's term: row r of a row-major (rows, cols) matrix of T, widened.
template <DType T>
struct MatrixColumns {
  static constexpr int kSums = 1;
  const void* x;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t first, int64_t count, Chunk (&chunks)[1]) const {
    chunks[0] = load_chunk<T>(x, r * cols + first, count);
  }
};

// out[s] (cols), each of dtype Out, += the column sums of term's sum s over rows, on cuda:`device`'s current stream;
// `device` is current. Row blocks enough to fill the GPU (kSumBlocksPerSm a multiprocessor); their partials, where
// there are several, and the column blocks' arrival counts live in a stream-ordered scratch.
template <DType Out, typename Term>
absl::Status add_column_sums(int device, int64_t rows, int64_t cols, ColumnOutputs<Term::kSums> out, Term term) {
  constexpr int kSums = Term::kSums;
  if (rows == 0 || cols == 0) return absl::OkStatus();
  int sms = 0;
  ZERO_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t col_blocks = (cols + kSumCols - 1) / kSumCols;
  // Rounded down, so the grid fits in one wave of resident blocks.
  const int64_t wanted = std::clamp<int64_t>(int64_t{kSumBlocksPerSm<kSums>} * sms / col_blocks, 1,
                                             std::min<int64_t>(kMaxBlocks, (rows + kSumGroups - 1) / kSumGroups));
  const int64_t block_rows = (rows + wanted - 1) / wanted;
  const int64_t row_blocks = (rows + block_rows - 1) / block_rows;
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks));
  const auto launch = [&](double* partial, unsigned* arrivals) {
    return launch_kernel(device, "column_sums_kernel", column_sums_kernel<Out, Term>, grid, kThreads, rows, cols,
                         block_rows, term, out, partial, arrivals);
  };
  if (row_blocks == 1) return launch(nullptr, nullptr);
  const size_t partial_bytes = kSums * row_blocks * cols * sizeof(double);
  return with_scratch(device, partial_bytes + col_blocks * sizeof(unsigned), [&](void* scratch) {
    unsigned* arrivals = reinterpret_cast<unsigned*>(static_cast<char*>(scratch) + partial_bytes);
    ZERO_RETURN_IF_ERROR(zero_on_current_stream(device, arrivals, col_blocks * sizeof(unsigned)));
    return launch(static_cast<double*>(scratch), arrivals);
  });
}

}  // namespace zero::kernels::cuda
