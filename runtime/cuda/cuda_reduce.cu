// The local backend's data movement on CUDA memory: fixed-order reduction and copies, several ranks on one GPU.
#include <algorithm>
#include <cstdint>
#include <span>

#include "runtime/comm/collective.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/half.cuh"
#include "runtime/cuda/launch.cuh"
#include "runtime/status.h"

namespace zero {

namespace {

constexpr int kMaxInputs = 64;

struct Inputs {
  const void* ptr[kMaxInputs];
};

__device__ float combine(float a, float b, ReduceOp op) {
  if (op == ReduceOp::kMax) return isnan(a) ? a : (a > b ? a : b);
  return __fadd_rn(a, b);  // never contracted or reassociated
}

__device__ int32_t combine(int32_t a, int32_t b, ReduceOp op) {
  if (op == ReduceOp::kMax) return a > b ? a : b;
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}

// The arithmetic of reduce_in_rank_order in runtime/comm/reduce.cc, element by element: fp32 accumulation
// in rank order, IEEE division for avg, one rounding at the end. Results agree with the CPU bit for bit
// (a sum that meets a NaN is NaN on both, with a payload that is the hardware's).
template <DType D>
__global__ void reduce_float_kernel(Inputs in, int n, void* out, int64_t count, ReduceOp op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    float acc = load_float<D>(in.ptr[0], i);
    for (int k = 1; k < n; ++k) acc = combine(acc, load_float<D>(in.ptr[k], i), op);
    if (op == ReduceOp::kAvg) acc = __fdiv_rn(acc, static_cast<float>(n));
    store_float<D>(out, i, acc);
  }
}

__global__ void reduce_int32_kernel(Inputs in, int n, void* out, int64_t count, ReduceOp op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    int32_t acc = static_cast<const int32_t*>(in.ptr[0])[i];
    for (int k = 1; k < n; ++k) acc = combine(acc, static_cast<const int32_t*>(in.ptr[k])[i], op);
    static_cast<int32_t*>(out)[i] = acc;
  }
}

}  // namespace

// Both are queued on the calling thread's current stream (the local backend's comm thread: the legacy default
// stream) and return without waiting; the backend orders them with the ranks' streams by events.
absl::Status cuda_reduce_in_rank_order(Device device, std::span<const void* const> inputs, void* out, int64_t count,
                                       DType dtype, ReduceOp op) {
  if (inputs.size() > kMaxInputs) {
    return absl::InvalidArgumentError(
        absl::StrCat("the local backend reduces at most ", kMaxInputs, " ranks' CUDA buffers, got ", inputs.size()));
  }
  if (count == 0) return absl::OkStatus();
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device.index));
  Inputs in{};
  for (size_t k = 0; k < inputs.size(); ++k) in.ptr[k] = inputs[k];
  const int n = static_cast<int>(inputs.size());
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 4096));
  void (*kernel)(Inputs, int, void*, int64_t, ReduceOp) = nullptr;
  switch (dtype) {
    case DType::kF32: kernel = reduce_float_kernel<DType::kF32>; break;
    case DType::kBF16: kernel = reduce_float_kernel<DType::kBF16>; break;
    case DType::kF16: kernel = reduce_float_kernel<DType::kF16>; break;
    case DType::kI32: kernel = reduce_int32_kernel; break;
    default: return absl::InvalidArgumentError(absl::StrCat("cannot reduce ", dtype_name(dtype)));
  }
  return launch_on_stream(current_stream(device), "reduce_in_rank_order", [&](cudaStream_t stream) {
    kernel<<<blocks, kThreads, 0, stream>>>(in, n, out, count, op);
    return absl::OkStatus();
  });
}

absl::Status cuda_queue_copy_bytes(Device device, void* dst, const void* src, int64_t nbytes) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device.index));
  return launch_on_stream(current_stream(device), "copy_bytes", [&](cudaStream_t stream) {
    return cuda_status(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  });
}

}  // namespace zero
