// The engine's flat buffer arithmetic on CUDA, bit for bit the CPU's: += and / in fp32, rounded once; zero fill.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/cuda/half.cuh"
#include "runtime/dtype_dispatch.h"

namespace zero::kernels::cuda {
namespace {

// src in S: T, or fp32 (a GEMM's product, matmul.cu's half weight gradient).
template <DType T, DType S>
__global__ void add_into_kernel(void* dst, const void* src, int64_t n) {
  for_each_chunk(n, [&](int64_t first, int64_t count) {
    combine_chunk<T, S>(dst, dst, src, first, count, [](float a, float b) { return a + b; });
  });
}

// IEEE division (nvcc's default -prec-div=true), as the CPU's.
template <DType T>
__global__ void divide_by_kernel(void* x, float divisor, int64_t n) {
  for_each_chunk(
      n, [&](int64_t first, int64_t count) { map_chunk<T>(x, x, first, count, [&](float v) { return v / divisor; }); });
}

}  // namespace

absl::Status add_into(int device, void* dst, const void* src, DType dtype, DType src_dtype, int64_t n) {
  return visit_with_operand("add_into", dtype, src_dtype, [&](auto t, auto s) {
    return launch_elementwise(device, "add_into_kernel", add_into_kernel<decltype(t)::value, decltype(s)::value>, n,
                              dst, src);
  });
}

absl::Status divide_by(int device, void* x, DType dtype, int64_t n, float divisor) {
  return visit_floating(dtype, [&](auto t) {
    return launch_elementwise(device, "divide_by_kernel", divide_by_kernel<decltype(t)::value>, n, x, divisor);
  });
}

absl::Status fill_zero(int device, void* x, int64_t nbytes) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  return zero_on_current_stream(device, x, static_cast<size_t>(nbytes));
}

}  // namespace zero::kernels::cuda
