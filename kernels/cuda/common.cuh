// Shared by the kernel .cu files: launch geometry, the elementwise launch (through cuda_api(), on the legacy default
// stream), warp reductions, deterministic column sums.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/launch.cuh"
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

// Makes `device` current, launches kernel(args..., n) over n elements on its legacy default stream, restores the
// device.
template <typename... Params>
absl::Status launch_elementwise(int device, const char* name, void (*kernel)(Params...), int64_t n, auto... args) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  return launch_kernel(device, name, kernel, blocks_for(n), kThreads, args..., n);
}

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// out[col] += sum over rows of term(r, col), accumulated in fp64 like runtime/parallel.h's add_column_sums. Block
// (kWarp, kSumRows): lane x owns a column, row group y sums rows y, y + kSumRows, ... in order, then the
// groups are added in order: no atomics, the same bits on every run.
inline constexpr int kSumRows = 8;
template <typename Term>
__global__ void add_column_sums_kernel(int64_t rows, int64_t cols, float* out, Term term) {
  __shared__ double partial[kSumRows][kWarp];
  const int64_t col = blockIdx.x * int64_t{kWarp} + threadIdx.x;
  double acc = 0.0;
  if (col < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kSumRows) acc += term(r, col);
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  double total = 0.0;
  for (int y = 0; y < kSumRows; ++y) total += partial[y][threadIdx.x];
  out[col] += static_cast<float>(total);
}

// The plain column sum's term: x[r, col] of a row-major (rows, cols) matrix.
struct MatrixElement {
  const float* x;
  int64_t cols;
  __device__ double operator()(int64_t r, int64_t col) const { return x[r * cols + col]; }
};

// On cuda:`device`'s legacy default stream; `device` is current.
template <typename Term>
absl::Status add_column_sums(int device, int64_t rows, int64_t cols, float* out, Term term) {
  return launch_kernel(device, "add_column_sums_kernel", add_column_sums_kernel<Term>,
                       static_cast<unsigned>((cols + kWarp - 1) / kWarp), dim3(kWarp, kSumRows), rows, cols, out, term);
}

}  // namespace zero::kernels::cuda
