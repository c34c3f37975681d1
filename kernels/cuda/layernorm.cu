// LayerNorm on CUDA, with the residual add fused before it or its gradient after: a warp per row, column sums.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / kWarp;

// Two-pass mean and biased variance of one row, as the CPU version (not Welford), after inp += residual where one
// is given (each lane adds and then reads back its own columns).
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, float* inp, const float* residual,
                                         const float* weight, const float* bias, int64_t n, int64_t c) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;
  float* x = inp + row * c;
  if (residual != nullptr) {
    const float* r = residual + row * c;
    for (int64_t i = lane; i < c; i += kWarp) x[i] += r[i];
  }
  float sum = 0.0f;
  for (int64_t i = lane; i < c; i += kWarp) sum += x[i];
  const float m = warp_sum(sum) / static_cast<float>(c);
  float sq = 0.0f;
  for (int64_t i = lane; i < c; i += kWarp) sq += (x[i] - m) * (x[i] - m);
  const float s = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(c) + kLayerNormEps);
  float* y = out + row * c;
  for (int64_t i = lane; i < c; i += kWarp) y[i] = (x[i] - m) * s * weight[i] + bias[i];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * weight, per row, + dresidual where
// given: added after rounding (__fadd_rn is never contracted into the product), as residual_backward adds it.
__global__ void layernorm_backward_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                          const float* mean, const float* rstd, const float* dresidual, int64_t n,
                                          int64_t c) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;
  const float* x = inp + row * c;
  const float* g = dout + row * c;
  const float mu = mean[row], rs = rstd[row];
  float dnorm_sum = 0.0f, dnorm_xhat_sum = 0.0f;
  for (int64_t i = lane; i < c; i += kWarp) {
    const float dnorm = g[i] * weight[i];
    dnorm_sum += dnorm;
    dnorm_xhat_sum += dnorm * (x[i] - mu) * rs;
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / static_cast<float>(c);
  const float dnorm_xhat_mean = warp_sum(dnorm_xhat_sum) / static_cast<float>(c);
  float* dx = dinp + row * c;
  const float* dr = dresidual != nullptr ? dresidual + row * c : nullptr;
  for (int64_t i = lane; i < c; i += kWarp) {
    const float d = (g[i] * weight[i] - dnorm_mean - (x[i] - mu) * rs * dnorm_xhat_mean) * rs;
    dx[i] = dr != nullptr ? __fadd_rn(d, dr[i]) : d;
  }
}

// dweight's term: dout * xhat.
struct DoutTimesXhat {
  const float* dout;
  const float* inp;
  const float* mean;
  const float* rstd;
  int64_t c;
  __device__ double operator()(int64_t r, int64_t i) const {
    return dout[r * c + i] * ((inp[r * c + i] - mean[r]) * rstd[r]);
  }
};

unsigned row_blocks(int64_t n) { return static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

absl::Status layernorm_forward(int device, float* out, float* mean, float* rstd, float* inp, const float* residual,
                               const float* weight, const float* bias, int64_t n, int64_t c) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  return launch_kernel(device, "layernorm_forward_kernel", layernorm_forward_kernel, row_blocks(n), kThreads, out, mean,
                       rstd, inp, residual, weight, bias, n, c);
}

absl::Status layernorm_backward(int device, float* dinp, float* dweight, float* dbias, const float* dout,
                                const float* inp, const float* weight, const float* mean, const float* rstd,
                                const float* dresidual, int64_t n, int64_t c) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(launch_kernel(device, "layernorm_backward_kernel", layernorm_backward_kernel, row_blocks(n),
                                     kThreads, dinp, dout, inp, weight, mean, rstd, dresidual, n, c));
  ZERO_RETURN_IF_ERROR(add_column_sums(device, n, c, dweight, DoutTimesXhat{dout, inp, mean, rstd, c}));
  return add_column_sums(device, n, c, dbias, MatrixElement<float>{dout, c});
}

}  // namespace zero::kernels::cuda
