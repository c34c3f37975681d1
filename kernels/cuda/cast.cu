// Dtype casts on CUDA with the CPU's exact bits (nearest-even and stochastic), device-to-host copies.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/cuda/half.cuh"
#include "runtime/dtype_dispatch.h"
#include "runtime/rounding.h"

namespace zero::kernels::cuda {
namespace {

struct Stochastic {
  bool enabled;
  uint64_t seed;
  int64_t step;
  int64_t index_offset;
};

// fp32 -> To in chunks (common.cuh); stochastic rounding draws each element's bits from its flat index.
template <DType To>
__global__ void narrow_kernel(void* out, const void* inp, Stochastic sr, int64_t n) {
  for_each_chunk(n, [&](int64_t first, int64_t count) {
    const Chunk x = load_chunk<DType::kF32>(inp, first, count);
    if (!sr.enabled) return store_chunk<To>(out, first, count, x);
    for (int e = 0; e < kChunk && e < count; ++e) {
      const uint32_t r = rounding_bits(sr.seed, sr.step, sr.index_offset + first + e);
      static_cast<uint16_t*>(out)[first + e] =
          To == DType::kBF16 ? bf16_stochastic(x.x[e], r) : fp16_stochastic(x.x[e], r);
    }
  });
}

template <DType From>
__global__ void widen_kernel(void* out, const void* inp, int64_t n) {
  for_each_chunk(n, [&](int64_t first, int64_t count) {
    store_chunk<DType::kF32>(out, first, count, load_chunk<From>(inp, first, count));
  });
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
    return visit_floating(to, [&](auto t) {
      return launch_elementwise(device, "narrow_kernel", narrow_kernel<decltype(t)::value>, n, out, inp, sr);
    });
  }
  if (is_half(from) && to == DType::kF32) {
    return visit_floating(from, [&](auto f) {
      return launch_elementwise(device, "widen_kernel", widen_kernel<decltype(f)::value>, n, out, inp);
    });
  }
  return absl::InvalidArgumentError(absl::StrCat("cast: no CUDA cast from ", dtype_name(from), " to ", dtype_name(to)));
}

}  // namespace zero::kernels::cuda
