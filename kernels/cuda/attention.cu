// Causal multi-head attention on CUDA, tiled as FlashAttention-2: a block owns 64 query (or key) rows of one head and
// streams the other side through shared memory 32 rows at a time, never forming the (T, T) scores; lse saved as on
// the CPU. q, k, v, out and the gradients in fp32, bf16 or fp16, widened as they are loaded and rounded once as they
// are stored; the arithmetic in fp32; no atomics, so every run gives the same bits. bf16/fp16 go through cuDNN's fused
// attention instead where the build has it and cuDNN takes the shape (cudnn_attention.h).
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#if ZERO_HAS_CUDNN
#include "kernels/cuda/cudnn_attention.h"
#endif
#include "runtime/cuda/half.cuh"
#include "runtime/dtype_dispatch.h"

namespace zero::kernels::cuda {
namespace {

// A block's tile: kRows rows it owns (queries, or keys for dk/dv) against kCols streamed ones, 256 threads as a
// 16 x 16 grid. Thread (ty, tx) holds rows ty + 16 i (i < 4) and columns tx + 16 j (j < 2) of the scores, and
// head dims tx + 16 j of its rows' outputs. Head dims move through shared memory kDimChunk at a time.
constexpr int kRows = 64;
constexpr int kCols = 32;
constexpr int kDimChunk = 64;
constexpr int kGrid = 16;
constexpr int kRowsPerThread = kRows / kGrid;
constexpr int kColsPerThread = kCols / kGrid;
static_assert(kGrid * kGrid == kThreads);

struct Dims {
  int64_t b, t, nh, hs;
  __host__ __device__ int64_t c() const { return nh * hs; }
};

// Rows of one head in a (B, T, width) tensor: row p's head dims at p0 + p * stride.
template <typename T>
struct HeadRows {
  T* p0;
  int64_t stride;
  __device__ T* row(int64_t p) const { return p0 + p * stride; }
};

// The tile a block owns: its head and first row. The grid runs the heaviest tiles of every head first: the causal
// mask gives the last queries, and the first keys, the most work.
struct Tile {
  int64_t b, h, first;
};

enum class Heavy { kLast, kFirst };

__device__ Tile tile_of(const Dims& d, Heavy heavy) {
  const int64_t tiles = (d.t + kRows - 1) / kRows, heads = d.b * d.nh;
  const int64_t bh = blockIdx.x % heads, i = blockIdx.x / heads;
  return {bh / d.nh, bh % d.nh, (heavy == Heavy::kLast ? tiles - 1 - i : i) * kRows};
}

// Rows of the tile's head: q, k or v (which = 0, 1, 2) of a (B, T, 3C) tensor, or of a (B, T, C) one.
enum class Part { kQ, kK, kV };

template <typename T>
__device__ HeadRows<T> qkv_rows(T* qkv, const Dims& d, const Tile& tile, Part part) {
  return {qkv + tile.b * d.t * 3 * d.c() + static_cast<int>(part) * d.c() + tile.h * d.hs, 3 * d.c()};
}
template <typename T>
__device__ HeadRows<T> out_rows(T* out, const Dims& d, const Tile& tile) {
  return {out + tile.b * d.t * d.c() + tile.h * d.hs, d.c()};
}

// Rows an operand is read from: elements of S (float, __nv_bfloat16 or __half), widened to fp32 as they are loaded.
template <typename S>
using Rows = HeadRows<const S>;

struct Shared {
  float rows[kRows][kDimChunk + 1];  // + 1: the rows a warp reads down one column fall in distinct banks
  float cols[kCols][kDimChunk + 1];
  float weights[kRows][kCols + 1];  // the tile's P or dS, for the weighted sums
};

__device__ int tx() { return threadIdx.x % kGrid; }
__device__ int ty() { return threadIdx.x / kGrid; }
__device__ int64_t row_of(int64_t first, int i) { return first + ty() + kGrid * i; }
__device__ int64_t col_of(int64_t first, int j) { return first + tx() + kGrid * j; }

// dst[r][e] = src row (first + r), head dim c0 + e, widened; zero past T and past hs.
template <int R, typename S>
__device__ void load_dims(float (&dst)[R][kDimChunk + 1], const Rows<S>& src, int64_t first, const Dims& d, int c0) {
  for (int i = threadIdx.x; i < R * kDimChunk; i += kThreads) {
    const int r = i / kDimChunk, e = i % kDimChunk;
    const int64_t p = first + r, dim = c0 + e;
    dst[r][e] = p < d.t && dim < d.hs ? widen(src.row(p)[dim]) : 0.0f;
  }
}

// acc[i][j] += a row row_of(first_a, i) · b row col_of(first_b, j), over the head dims.
template <int HD, typename S>
__device__ void add_dots(float (&acc)[kRowsPerThread][kColsPerThread], Shared& sm, const Rows<S>& a, int64_t first_a,
                         const Rows<S>& b, int64_t first_b, const Dims& d) {
#pragma unroll
  for (int c0 = 0; c0 < HD; c0 += kDimChunk) {
    __syncthreads();  // every thread is done with the buffers' last contents
    load_dims(sm.rows, a, first_a, d, c0);
    load_dims(sm.cols, b, first_b, d, c0);
    __syncthreads();
#pragma unroll 8
    for (int e = 0; e < kDimChunk; ++e) {
      float x[kRowsPerThread], y[kColsPerThread];
      for (int i = 0; i < kRowsPerThread; ++i) x[i] = sm.rows[ty() + kGrid * i][e];
      for (int j = 0; j < kColsPerThread; ++j) y[j] = sm.cols[tx() + kGrid * j][e];
      for (int i = 0; i < kRowsPerThread; ++i) {
        for (int j = 0; j < kColsPerThread; ++j) acc[i][j] += x[i] * y[j];
      }
    }
  }
}

// acc[i][j] += sum over the tile's columns c of weights[ty + 16 i][c] · b row (first + c), head dim tx + 16 j. The
// caller has written the weights.
template <int HD, typename S>
__device__ void add_weighted(float (&acc)[kRowsPerThread][HD / kGrid], Shared& sm, const Rows<S>& b, int64_t first,
                             const Dims& d) {
#pragma unroll
  for (int c0 = 0; c0 < HD; c0 += kDimChunk) {
    __syncthreads();  // the weights are written; every thread is done with cols
    load_dims(sm.cols, b, first, d, c0);
    __syncthreads();
    for (int c = 0; c < kCols; ++c) {
      float w[kRowsPerThread];
      for (int i = 0; i < kRowsPerThread; ++i) w[i] = sm.weights[ty() + kGrid * i][c];
#pragma unroll
      for (int j = 0; j < kDimChunk / kGrid; ++j) {
        const float y = sm.cols[c][tx() + kGrid * j];
        for (int i = 0; i < kRowsPerThread; ++i) acc[i][c0 / kGrid + j] += w[i] * y;
      }
    }
  }
}

// weights[ty + 16 i][tx + 16 j] = w[i][j]
__device__ void set_weights(Shared& sm, const float (&w)[kRowsPerThread][kColsPerThread]) {
  for (int i = 0; i < kRowsPerThread; ++i) {
    for (int j = 0; j < kColsPerThread; ++j) sm.weights[ty() + kGrid * i][tx() + kGrid * j] = w[i][j];
  }
}

// Over the 16 threads that share a row (lanes 0-15 or 16-31 of a warp).
__device__ float row_sum(float x) {
  for (int offset = kGrid / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ float row_max(float x) {
  for (int offset = kGrid / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Query `query` sees key `key`: the causal mask, inside the sequence.
__device__ bool sees(int64_t query, int64_t key, const Dims& d) { return key <= query && query < d.t; }

// The keys a query tile starting at `first` sees: [0, min(first + kRows, T)).
__device__ int64_t keys_end(int64_t first, const Dims& d) { return first + kRows < d.t ? first + kRows : d.t; }

// dst row row_of(first, i), head dim tx + 16 j = x[i][j] rounded once to S, rows inside T and dims inside hs.
template <int HD, typename S>
__device__ void store_rows(const HeadRows<S>& dst, int64_t first, const float (&x)[kRowsPerThread][HD / kGrid],
                           const Dims& d) {
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t p = row_of(first, i);
    if (p >= d.t) continue;
    for (int j = 0; j < HD / kGrid; ++j) {
      const int dim = tx() + kGrid * j;
      if (dim < d.hs) dst.row(p)[dim] = narrow<S>(x[i][j]);
    }
  }
}

// Online softmax over the key tiles: per query row the running max m, the sum l of exp(s - m) and
// o = sum exp(s - m) v; at the end out = o / l and lse = m + log l.
template <int HD, typename S>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(S* out, float* lse, const S* inp, Dims d, float scale) {
  __shared__ Shared sm;
  const Tile tile = tile_of(d, Heavy::kLast);
  const Rows<S> q = qkv_rows(inp, d, tile, Part::kQ), k = qkv_rows(inp, d, tile, Part::kK);
  const Rows<S> v = qkv_rows(inp, d, tile, Part::kV);
  float m[kRowsPerThread], l[kRowsPerThread], o[kRowsPerThread][HD / kGrid] = {};
  for (int i = 0; i < kRowsPerThread; ++i) m[i] = -INFINITY, l[i] = 0.0f;
  for (int64_t k0 = 0; k0 < keys_end(tile.first, d); k0 += kCols) {
    float s[kRowsPerThread][kColsPerThread] = {};
    add_dots<HD>(s, sm, q, tile.first, k, k0, d);
    for (int i = 0; i < kRowsPerThread; ++i) {
      float tile_max = -INFINITY;
      for (int j = 0; j < kColsPerThread; ++j) {
        s[i][j] = sees(row_of(tile.first, i), col_of(k0, j), d) ? scale * s[i][j] : -INFINITY;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      const float m_new = fmaxf(m[i], row_max(tile_max));
      const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row past T sees no key: its sums stay 0
      const float alpha = expf(m[i] - base);
      float p_sum = 0.0f;
      for (float& x : s[i]) p_sum += x = expf(x - base);  // s becomes p
      l[i] = l[i] * alpha + row_sum(p_sum);
      m[i] = m_new;
      for (float& x : o[i]) x *= alpha;
    }
    set_weights(sm, s);
    add_weighted<HD>(o, sm, v, k0, d);
  }
  for (int i = 0; i < kRowsPerThread; ++i) {
    const float inv = 1.0f / l[i];
    for (float& x : o[i]) x *= inv;
    const int64_t query = row_of(tile.first, i);
    if (tx() == 0 && query < d.t) lse[(tile.b * d.nh + tile.h) * d.t + query] = m[i] + logf(l[i]);
  }
  store_rows<HD>(out_rows(out, d, tile), tile.first, o, d);
}

// With P = softmax(S), S = scale q k^T (causal), O = P v and D_i = dO_i · O_i:
// dS_ij = P_ij (dO_i · v_j - D_i);  dq_i = scale sum_{j <= i} dS_ij k_j. Saves D for the key pass.
template <int HD, typename S>
__global__ void __launch_bounds__(kThreads)
    attention_backward_query_kernel(S* dinp, float* dsum, const S* dout, const S* inp, const S* out, const float* lse,
                                    Dims d, float scale) {
  __shared__ Shared sm;
  const Tile tile = tile_of(d, Heavy::kLast);
  const Rows<S> q = qkv_rows(inp, d, tile, Part::kQ), k = qkv_rows(inp, d, tile, Part::kK);
  const Rows<S> v = qkv_rows(inp, d, tile, Part::kV), o = out_rows(out, d, tile), dout_rows = out_rows(dout, d, tile);
  const int64_t stats = (tile.b * d.nh + tile.h) * d.t;  // the head's lse and D rows
  float di[kRowsPerThread], li[kRowsPerThread], dq[kRowsPerThread][HD / kGrid] = {};
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t query = row_of(tile.first, i);
    float part = 0.0f;
    if (query < d.t) {
      for (int64_t dim = tx(); dim < d.hs; dim += kGrid)
        part += widen(dout_rows.row(query)[dim]) * widen(o.row(query)[dim]);
    }
    di[i] = row_sum(part);
    li[i] = query < d.t ? lse[stats + query] : 0.0f;
    if (tx() == 0 && query < d.t) dsum[stats + query] = di[i];
  }
  for (int64_t k0 = 0; k0 < keys_end(tile.first, d); k0 += kCols) {
    float s[kRowsPerThread][kColsPerThread] = {}, ds[kRowsPerThread][kColsPerThread] = {};
    add_dots<HD>(s, sm, q, tile.first, k, k0, d);
    add_dots<HD>(ds, sm, dout_rows, tile.first, v, k0, d);  // dO_i · v_j
    for (int i = 0; i < kRowsPerThread; ++i) {
      for (int j = 0; j < kColsPerThread; ++j) {
        const float p = sees(row_of(tile.first, i), col_of(k0, j), d) ? expf(scale * s[i][j] - li[i]) : 0.0f;
        ds[i][j] = p * (ds[i][j] - di[i]) * scale;
      }
    }
    set_weights(sm, ds);
    add_weighted<HD>(dq, sm, k, k0, d);
  }
  store_rows<HD>(qkv_rows(dinp, d, tile, Part::kQ), tile.first, dq, d);
}

// Which gradients a key pass makes: both, or one of them where both would not fit in registers (head size 256).
enum class KeyGrads { kBoth, kDk, kDv };

// dv_j = sum_{i >= j} P_ij dO_i;  dk_j = scale sum_{i >= j} dS_ij q_i. The block's rows are keys; the queries from
// its first key on stream past.
template <int HD, KeyGrads kGrads, typename S>
__global__ void __launch_bounds__(kThreads)
    attention_backward_key_kernel(S* dinp, const float* dsum, const S* dout, const S* inp, const float* lse, Dims d,
                                  float scale) {
  __shared__ Shared sm;
  const Tile tile = tile_of(d, Heavy::kFirst);
  const Rows<S> q = qkv_rows(inp, d, tile, Part::kQ), k = qkv_rows(inp, d, tile, Part::kK);
  const Rows<S> v = qkv_rows(inp, d, tile, Part::kV), dout_rows = out_rows(dout, d, tile);
  const int64_t stats = (tile.b * d.nh + tile.h) * d.t;
  float dk[kRowsPerThread][HD / kGrid] = {}, dv[kRowsPerThread][HD / kGrid] = {};
  for (int64_t q0 = tile.first; q0 < d.t; q0 += kCols) {
    float p[kRowsPerThread][kColsPerThread] = {}, ds[kRowsPerThread][kColsPerThread] = {};
    add_dots<HD>(p, sm, k, tile.first, q, q0, d);                                                  // k_j · q_i
    if constexpr (kGrads != KeyGrads::kDv) add_dots<HD>(ds, sm, v, tile.first, dout_rows, q0, d);  // v_j · dO_i
    for (int j = 0; j < kColsPerThread; ++j) {
      const int64_t query = col_of(q0, j);
      const float lj = query < d.t ? lse[stats + query] : 0.0f, dj = query < d.t ? dsum[stats + query] : 0.0f;
      for (int i = 0; i < kRowsPerThread; ++i) {
        p[i][j] = sees(query, row_of(tile.first, i), d) ? expf(scale * p[i][j] - lj) : 0.0f;
        ds[i][j] = p[i][j] * (ds[i][j] - dj) * scale;
      }
    }
    if constexpr (kGrads != KeyGrads::kDk) {
      set_weights(sm, p);
      add_weighted<HD>(dv, sm, dout_rows, q0, d);
    }
    if constexpr (kGrads == KeyGrads::kBoth) __syncthreads();  // every thread is done reading P
    if constexpr (kGrads != KeyGrads::kDv) {
      set_weights(sm, ds);
      add_weighted<HD>(dk, sm, q, q0, d);
    }
  }
  if constexpr (kGrads != KeyGrads::kDv) store_rows<HD>(qkv_rows(dinp, d, tile, Part::kK), tile.first, dk, d);
  if constexpr (kGrads != KeyGrads::kDk) store_rows<HD>(qkv_rows(dinp, d, tile, Part::kV), tile.first, dv, d);
}

unsigned tile_blocks(const Dims& d) { return static_cast<unsigned>(d.b * d.nh * ((d.t + kRows - 1) / kRows)); }

float score_scale(int64_t hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }

// f(std::integral_constant<int, HD>) with HD the padded head size the kernels are built for: 64, 128 or 256.
template <typename F>
absl::Status with_head_dim(int64_t hs, F&& f) {
  if (hs <= 64) return f(std::integral_constant<int, 64>{});
  if (hs <= 128) return f(std::integral_constant<int, 128>{});
  return f(std::integral_constant<int, 256>{});
}

// set_cudnn_attention's switch: on unless ZERO_CUDNN_ATTENTION=0.
std::atomic<bool>& cudnn_attention_on() {
  static std::atomic<bool> on([] {
    const char* env = std::getenv("ZERO_CUDNN_ATTENTION");
    return env == nullptr || std::string_view(env) != "0";
  }());
  return on;
}

// Whether a half attention of this shape ran through cuDNN (run(), a cudnn_attention_* call); false where the build
// has no cuDNN, it is switched off, or cuDNN refused the shape.
template <typename Run>
absl::StatusOr<bool> through_cudnn(DType dtype, Run&& run) {
  if (dtype == DType::kF32 || !cudnn_attention_on().load()) return false;
#if ZERO_HAS_CUDNN
  return run();
#else
  (void)run;
  return false;
#endif
}

}  // namespace

bool set_cudnn_attention(bool enabled) { return cudnn_attention_on().exchange(enabled); }

absl::Status attention_forward(int device, void* out, float* lse, const void* inp, DType dtype, int64_t b, int64_t t,
                               int64_t nh, int64_t hs) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  const Dims d{b, t, nh, hs};
  if (b * nh * t == 0) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(const bool ran, through_cudnn(dtype, [&] {
                          return cudnn_attention_forward(device, out, lse, inp, dtype, b, t, nh, hs);
                        }));
  if (ran) return absl::OkStatus();
  return visit_floating(dtype, [&](auto type) {
    using S = DeviceElement<decltype(type)::value>;
    return with_head_dim(hs, [&](auto hd) {
      return launch_kernel(device, "attention_forward_kernel", attention_forward_kernel<decltype(hd)::value, S>,
                           tile_blocks(d), kThreads, static_cast<S*>(out), lse, static_cast<const S*>(inp), d,
                           score_scale(hs));
    });
  });
}

absl::Status attention_backward(int device, void* dinp, const void* dout, const void* inp, const void* out,
                                const float* lse, DType dtype, int64_t b, int64_t t, int64_t nh, int64_t hs) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  const Dims d{b, t, nh, hs};
  const int64_t rows = b * nh * t;
  if (rows == 0) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(const bool ran, through_cudnn(dtype, [&] {
                          return cudnn_attention_backward(device, dinp, dout, inp, out, lse, dtype, b, t, nh, hs);
                        }));
  if (ran) return absl::OkStatus();
  return with_scratch(device, rows * sizeof(float), [&](void* scratch) {
    float* dsum = static_cast<float*>(scratch);  // D (B, NH, T)
    return visit_floating(dtype, [&](auto type) {
      using S = DeviceElement<decltype(type)::value>;
      auto* dinp_s = static_cast<S*>(dinp);
      const auto *dout_s = static_cast<const S*>(dout), *inp_s = static_cast<const S*>(inp);
      return with_head_dim(hs, [&](auto hd) {
        constexpr int kHeadDim = decltype(hd)::value;
        ZERO_RETURN_IF_ERROR(launch_kernel(
            device, "attention_backward_query_kernel", attention_backward_query_kernel<kHeadDim, S>, tile_blocks(d),
            kThreads, dinp_s, dsum, dout_s, inp_s, static_cast<const S*>(out), lse, d, score_scale(hs)));
        const auto key_pass = [&](auto* kernel) {
          return launch_kernel(device, "attention_backward_key_kernel", kernel, tile_blocks(d), kThreads, dinp_s, dsum,
                               dout_s, inp_s, lse, d, score_scale(hs));
        };
        if constexpr (kHeadDim <= 128) {
          return key_pass(attention_backward_key_kernel<kHeadDim, KeyGrads::kBoth, S>);
        } else {
          ZERO_RETURN_IF_ERROR(key_pass(attention_backward_key_kernel<kHeadDim, KeyGrads::kDk, S>));
          return key_pass(attention_backward_key_kernel<kHeadDim, KeyGrads::kDv, S>);
        }
      });
    });
  });
}

}  // namespace zero::kernels::cuda
