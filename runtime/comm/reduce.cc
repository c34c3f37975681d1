#include "runtime/comm/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace zero {

#ifdef ZERO_HAS_CUDA
// runtime/cuda/cuda_reduce.cu
absl::Status cuda_reduce_in_rank_order(Device device, std::span<const void* const> inputs, void* out, int64_t count,
                                       DType dtype, ReduceOp op);
absl::Status cuda_copy_bytes(Device device, void* dst, const void* src, int64_t nbytes);
#endif

namespace {

constexpr int64_t kBlock = 1024;  // elements reduced per pass; the fp32 accumulator stays in L1

template <typename Acc>
inline Acc combine(Acc a, Acc b, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    if constexpr (std::is_floating_point_v<Acc>) {
      if (std::isnan(a)) return a;
    }
    return a > b ? a : b;
  }
  if constexpr (std::is_same_v<Acc, int32_t>) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  } else {
    return a + b;
  }
}

// One block [begin, begin + n) of the floating reduction.
void reduce_float_block(std::span<const void* const> inputs, void* out, int64_t begin, int64_t n, DType dtype,
                        ReduceOp op) {
  float acc[kBlock];
  for (int64_t j = 0; j < n; ++j) acc[j] = load_as_float(inputs[0], dtype, begin + j);
  for (size_t k = 1; k < inputs.size(); ++k) {
    if (dtype == DType::kF32 && op != ReduceOp::kMax) {
      const float* in = static_cast<const float*>(inputs[k]) + begin;
      for (int64_t j = 0; j < n; ++j) acc[j] += in[j];  // the hot path: vectorized
    } else {
      for (int64_t j = 0; j < n; ++j) acc[j] = combine(acc[j], load_as_float(inputs[k], dtype, begin + j), op);
    }
  }
  if (op == ReduceOp::kAvg) {
    const float k = static_cast<float>(inputs.size());
    for (int64_t j = 0; j < n; ++j) acc[j] /= k;
  }
  for (int64_t j = 0; j < n; ++j) store_from_float(out, dtype, begin + j, acc[j]);
}

void reduce_int32_block(std::span<const void* const> inputs, void* out, int64_t begin, int64_t n, ReduceOp op) {
  int32_t acc[kBlock];
  std::memcpy(acc, static_cast<const int32_t*>(inputs[0]) + begin, n * sizeof(int32_t));
  for (size_t k = 1; k < inputs.size(); ++k) {
    const int32_t* in = static_cast<const int32_t*>(inputs[k]) + begin;
    for (int64_t j = 0; j < n; ++j) acc[j] = combine(acc[j], in[j], op);
  }
  std::memcpy(static_cast<int32_t*>(out) + begin, acc, n * sizeof(int32_t));
}

}  // namespace

absl::Status reduce_in_rank_order(Device device, std::span<const void* const> inputs, void* out, int64_t count,
                                  DType dtype, ReduceOp op) {
  if (inputs.empty()) return absl::InvalidArgumentError("reduce_in_rank_order: no inputs");
  if (device.is_cuda()) {
#ifdef ZERO_HAS_CUDA
    return cuda_reduce_in_rank_order(device, inputs, out, count, dtype, op);
#else
    return absl::FailedPreconditionError("reduction on CUDA memory in a build without CUDA");
#endif
  }
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    if (dtype == DType::kI32) {
      reduce_int32_block(inputs, out, begin, n, op);
    } else {
      reduce_float_block(inputs, out, begin, n, dtype, op);
    }
  }
  return absl::OkStatus();
}

absl::Status copy_bytes(Device device, void* dst, const void* src, int64_t nbytes) {
  if (nbytes == 0 || dst == src) return absl::OkStatus();
  if (device.is_cuda()) {
#ifdef ZERO_HAS_CUDA
    return cuda_copy_bytes(device, dst, src, nbytes);
#else
    return absl::FailedPreconditionError("copy of CUDA memory in a build without CUDA");
#endif
  }
  std::memcpy(dst, src, static_cast<size_t>(nbytes));
  return absl::OkStatus();
}

}  // namespace zero
