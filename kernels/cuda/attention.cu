// Causal multi-head attention on CUDA: one warp per query (forward, dq) or key (dk, dv) row; lse saved as on the CPU.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / kWarp;
constexpr int kPerLane = kMaxHeadDim / kWarp;  // head dims held by one lane: lane, lane + 32, ...

struct Dims {
  int64_t b, t, nh, hs;
  __device__ int64_t c() const { return nh * hs; }
  __device__ int64_t rows() const { return b * nh * t; }
};

// The (batch, head, position) of a warp's row, with the row's offsets into (B, T, 3C) and (B, T, C).
struct Row {
  int64_t bh;     // b * NH + h: the lse row
  int64_t pos;    // the query (or key) position
  int64_t qkv;    // offset of q[b, pos, h, 0] in inp; k and v are + C and + 2C
  int64_t head0;  // offset of q[b, 0, h, 0] in inp
  int64_t o;      // offset of out[b, pos, h, 0]
  int64_t o0;     // offset of out[b, 0, h, 0]
};

__device__ Row row_of(int64_t row, const Dims& d) {
  const int64_t pos = row % d.t, bh = row / d.t, h = bh % d.nh, b = bh / d.nh;
  const int64_t head0 = b * d.t * 3 * d.c() + h * d.hs, o0 = b * d.t * d.c() + h * d.hs;
  return {bh, pos, head0 + pos * 3 * d.c(), head0, o0 + pos * d.c(), o0};
}

// A head-size vector spread over the warp: element lane + 32 k in slot k, 0 past hs.
struct Lanes {
  float v[kPerLane];
};

__device__ Lanes load(const float* p, int64_t hs) {
  Lanes x;
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t e = threadIdx.x % kWarp + k * kWarp;
    x.v[k] = e < hs ? p[e] : 0.0f;
  }
  return x;
}

__device__ void store(float* p, const Lanes& x, int64_t hs) {
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t e = threadIdx.x % kWarp + k * kWarp;
    if (e < hs) p[e] = x.v[k];
  }
}

// x · p[0, hs) over the warp; every lane gets the sum.
__device__ float dot(const Lanes& x, const float* p, int64_t hs) {
  float s = 0.0f;
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t e = threadIdx.x % kWarp + k * kWarp;
    if (e < hs) s += x.v[k] * p[e];
  }
  return warp_sum(s);
}

// acc += a * p[0, hs)
__device__ void axpy(Lanes& acc, float a, const float* p, int64_t hs) {
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t e = threadIdx.x % kWarp + k * kWarp;
    if (e < hs) acc.v[k] += a * p[e];
  }
}

__device__ int64_t warp_row() { return blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarp; }

// Two passes as the CPU: the row's maximum score, then exp(score - max) summed in fp64 and applied to v.
__global__ void attention_forward_kernel(float* out, float* lse, const float* inp, Dims d, float scale) {
  const int64_t row = warp_row();
  if (row >= d.rows()) return;
  const Row r = row_of(row, d);
  const int64_t stride = 3 * d.c();
  const Lanes q = load(inp + r.qkv, d.hs);
  const float* k = inp + r.head0 + d.c();
  const float* v = inp + r.head0 + 2 * d.c();
  float max = -INFINITY;
  for (int64_t j = 0; j <= r.pos; ++j) max = fmaxf(max, scale * dot(q, k + j * stride, d.hs));
  Lanes o{};
  double sum = 0.0;
  for (int64_t j = 0; j <= r.pos; ++j) {
    const float p = expf(scale * dot(q, k + j * stride, d.hs) - max);
    sum += p;
    axpy(o, p, v + j * stride, d.hs);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (float& x : o.v) x *= inv;
  store(out + r.o, o, d.hs);
  if (threadIdx.x % kWarp == 0) lse[r.bh * d.t + r.pos] = max + static_cast<float>(log(sum));
}

// With P = softmax(S), S = scale q k^T (causal), O = P v and D_i = dO_i · O_i:
// dS_ij = P_ij (dO_i · v_j - D_i);  dq_i = scale sum_{j <= i} dS_ij k_j. Saves D_i for the key pass.
__global__ void attention_backward_query_kernel(float* dinp, float* dsum, const float* dout, const float* inp,
                                                const float* out, const float* lse, Dims d, float scale) {
  const int64_t row = warp_row();
  if (row >= d.rows()) return;
  const Row r = row_of(row, d);
  const int64_t stride = 3 * d.c();
  const Lanes q = load(inp + r.qkv, d.hs);
  const Lanes dq_out = load(dout + r.o, d.hs);
  const float di = dot(dq_out, out + r.o, d.hs);
  const float li = lse[r.bh * d.t + r.pos];
  Lanes dq{};
  for (int64_t j = 0; j <= r.pos; ++j) {
    const float* kj = inp + r.head0 + d.c() + j * stride;
    const float pij = expf(scale * dot(q, kj, d.hs) - li);
    const float dsij = pij * (dot(dq_out, kj + d.c(), d.hs) - di) * scale;
    axpy(dq, dsij, kj, d.hs);
  }
  store(dinp + r.qkv, dq, d.hs);
  if (threadIdx.x % kWarp == 0) dsum[r.bh * d.t + r.pos] = di;
}

// dv_j = sum_{i >= j} P_ij dO_i;  dk_j = scale sum_{i >= j} dS_ij q_i. The warp's row is key j.
__global__ void attention_backward_key_kernel(float* dinp, const float* dsum, const float* dout, const float* inp,
                                              const float* lse, Dims d, float scale) {
  const int64_t row = warp_row();
  if (row >= d.rows()) return;
  const Row r = row_of(row, d);
  const int64_t stride = 3 * d.c();
  const Lanes k = load(inp + r.qkv + d.c(), d.hs);
  const Lanes v = load(inp + r.qkv + 2 * d.c(), d.hs);
  Lanes dk{}, dv{};
  for (int64_t i = r.pos; i < d.t; ++i) {
    const float* qi = inp + r.head0 + i * stride;
    const float* doi = dout + r.o0 + i * d.c();
    const float pij = expf(scale * dot(k, qi, d.hs) - lse[r.bh * d.t + i]);
    const float dsij = pij * (dot(v, doi, d.hs) - dsum[r.bh * d.t + i]) * scale;
    axpy(dv, pij, doi, d.hs);
    axpy(dk, dsij, qi, d.hs);
  }
  store(dinp + r.qkv + d.c(), dk, d.hs);
  store(dinp + r.qkv + 2 * d.c(), dv, d.hs);
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

float score_scale(int64_t hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }

}  // namespace

absl::Status attention_forward(int device, float* out, float* lse, const float* inp, int64_t b, int64_t t, int64_t nh,
                               int64_t hs) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  const Dims d{b, t, nh, hs};
  if (b * nh * t == 0) return absl::OkStatus();
  return launch_kernel(device, "attention_forward_kernel", attention_forward_kernel, row_blocks(b * nh * t), kThreads,
                       out, lse, inp, d, score_scale(hs));
}

absl::Status attention_backward(int device, float* dinp, const float* dout, const float* inp, const float* out,
                                const float* lse, int64_t b, int64_t t, int64_t nh, int64_t hs) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  const Dims d{b, t, nh, hs};
  const int64_t rows = b * nh * t;
  if (rows == 0) return absl::OkStatus();
  const Stream stream = Stream::legacy(device);
  ZERO_ASSIGN_OR_RETURN(void* scratch, cuda_api().allocate(rows * sizeof(float), stream));
  float* dsum = static_cast<float*>(scratch);  // D (B, NH, T)
  absl::Status status = launch_kernel(device, "attention_backward_query_kernel", attention_backward_query_kernel,
                                      row_blocks(rows), kThreads, dinp, dsum, dout, inp, out, lse, d, score_scale(hs));
  if (status.ok()) {
    status.Update(launch_kernel(device, "attention_backward_key_kernel", attention_backward_key_kernel,
                                row_blocks(rows), kThreads, dinp, dsum, dout, inp, lse, d, score_scale(hs)));
  }
  ZERO_RETURN_IF_ERROR(cuda_api().free(dsum, stream));
  return status;
}

}  // namespace zero::kernels::cuda
