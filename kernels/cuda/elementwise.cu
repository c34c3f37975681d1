// GELU (tanh approximation) and the residual add on CUDA, forward and backward, in fp32, bf16 or fp16: a thread per
// 8-element chunk, computing in fp32 and rounding each stored element once.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gelu.cuh"
#include "runtime/cuda/half.cuh"
#include "runtime/dtype_dispatch.h"

namespace zero::kernels::cuda {
namespace {

template <DType T>
__global__ void gelu_forward_kernel(void* out, const void* inp, int64_t n) {
  for_each_chunk(
      n, [&](int64_t first, int64_t count) { map_chunk<T>(out, inp, first, count, [](float v) { return gelu(v); }); });
}

// dout in D: T, or fp32 (a GEMM's product, matmul.cu's GELU backward).
template <DType T, DType D>
__global__ void gelu_backward_kernel(void* dinp, const void* inp, const void* dout, int64_t n) {
  for_each_chunk(n, [&](int64_t first, int64_t count) {
    combine_chunk<T, D>(dinp, inp, dout, first, count, [](float v, float d) { return gelu_slope(v) * d; });
  });
}

template <DType T>
__global__ void residual_forward_kernel(void* out, const void* a, const void* b, int64_t n) {
  for_each_chunk(n, [&](int64_t first, int64_t count) {
    combine_chunk<T>(out, a, b, first, count, [](float x, float y) { return x + y; });
  });
}

}  // namespace

absl::Status gelu_forward(int device, void* out, const void* inp, DType dtype, int64_t n) {
  return visit_floating(dtype, [&](auto t) {
    return launch_elementwise(device, "gelu_forward_kernel", gelu_forward_kernel<decltype(t)::value>, n, out, inp);
  });
}

absl::Status gelu_backward(int device, void* dinp, const void* inp, const void* dout, DType dtype, DType dout_dtype,
                           int64_t n) {
  return visit_with_operand("gelu_backward", dtype, dout_dtype, [&](auto t, auto d) {
    return launch_elementwise(device, "gelu_backward_kernel",
                              gelu_backward_kernel<decltype(t)::value, decltype(d)::value>, n, dinp, inp, dout);
  });
}

absl::Status residual_forward(int device, void* out, const void* a, const void* b, DType dtype, int64_t n) {
  return visit_floating(dtype, [&](auto t) {
    return launch_elementwise(device, "residual_forward_kernel", residual_forward_kernel<decltype(t)::value>, n, out, a,
                              b);
  });
}

}  // namespace zero::kernels::cuda
