// Dtype casts on CUDA with the CPU's exact bits (nearest-even and stochastic), device-to-host copies.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/cuda/half.cuh"
#include "runtime/rounding.h"

namespace zero::kernels::cuda {
namespace {

struct Stochastic {
  bool enabled;
  uint64_t seed;
  int64_t step;
  int64_t index_offset;
};

__global__ void narrow_kernel(uint16_t* out, const float* inp, int64_t n, bool bf16, Stochastic sr) {
  ZERO_GRID_STRIDE(i, n) {
    if (sr.enabled) {
      const uint32_t r = rounding_bits(sr.seed, sr.step, sr.index_offset + i);
      out[i] = bf16 ? bf16_stochastic(inp[i], r) : fp16_stochastic(inp[i], r);
    } else {
      out[i] = bf16 ? to_bf16(inp[i]) : to_fp16(inp[i]);
    }
  }
}

__global__ void widen_kernel(float* out, const uint16_t* inp, int64_t n, bool bf16) {
  ZERO_GRID_STRIDE(i, n) out[i] = bf16 ? from_bf16(inp[i]) : from_fp16(inp[i]);
}

bool is_half(DType t) { return t == DType::kBF16 || t == DType::kF16; }

}  // namespace

absl::Status cast(int device, void* out, DType to, const void* inp, DType from, int64_t n,
                  const StochasticRounding* stochastic) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  if (from == to) {
    return launch_on_stream(current_cuda_stream(device), "cast", [&](cudaStream_t stream) {
      return cuda_status(cudaMemcpyAsync(out, inp, n * dtype_size(from), cudaMemcpyDeviceToDevice, stream),
                         "cudaMemcpyAsync");
    });
  }
  if (from == DType::kF32 && is_half(to)) {
    const Stochastic sr = stochastic == nullptr
                              ? Stochastic{false, 0, 0, 0}
                              : Stochastic{true, stochastic->seed, stochastic->step, stochastic->index_offset};
    return launch_kernel(device, "narrow_kernel", narrow_kernel, blocks_for(n), kThreads, static_cast<uint16_t*>(out),
                         static_cast<const float*>(inp), n, to == DType::kBF16, sr);
  }
  if (is_half(from) && to == DType::kF32) {
    return launch_kernel(device, "widen_kernel", widen_kernel, blocks_for(n), kThreads, static_cast<float*>(out),
                         static_cast<const uint16_t*>(inp), n, from == DType::kBF16);
  }
  return absl::InvalidArgumentError(absl::StrCat("cast: no CUDA cast from ", dtype_name(from), " to ", dtype_name(to)));
}

}  // namespace zero::kernels::cuda
