#include "runtime/comm/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/sim/sim_api.h"

namespace zero {

#ifdef ZERO_HAS_CUDA
// runtime/cuda/cuda_reduce.cu
absl::Status cuda_reduce_in_rank_order(Device device, std::span<const void* const> inputs, void* out, int64_t count,
                                       DType dtype, ReduceOp op);
absl::Status cuda_queue_copy_bytes(Device device, void* dst, const void* src, int64_t nbytes);
#endif

namespace {

constexpr int64_t kBlock = 1024;  // elements reduced per pass; the fp32 accumulator stays in L1

// How each floating dtype enters and leaves the fp32 accumulator.
struct F32Codec {
  using T = float;
  static float load(float v) { return v; }
  static float store(float v) { return v; }
};
struct BF16Codec {
  using T = uint16_t;
  static float load(uint16_t v) { return bf16_to_float(v); }
  static uint16_t store(float v) { return float_to_bf16(v); }
};
struct F16Codec {
  using T = uint16_t;
  static float load(uint16_t v) { return fp16_to_float(v); }
  static uint16_t store(float v) { return float_to_fp16(v); }
};

template <ReduceOp kOp>
inline float combine(float a, float b) {
  if constexpr (kOp == ReduceOp::kMax) {
    return std::isnan(a) ? a : (a > b ? a : b);
  } else {
    return a + b;
  }
}

template <ReduceOp kOp>
inline int32_t combine(int32_t a, int32_t b) {
  if constexpr (kOp == ReduceOp::kMax) {
    return a > b ? a : b;
  } else {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
}

// Elements [begin, begin + n) of a floating reduction; dtype and op are compile-time so loops vectorize.
template <typename Codec, ReduceOp kOp>
void reduce_float_block(std::span<const void* const> inputs, void* out, int64_t begin, int64_t n) {
  using T = typename Codec::T;
  float acc[kBlock];
  const T* first = static_cast<const T*>(inputs[0]) + begin;
  for (int64_t j = 0; j < n; ++j) acc[j] = Codec::load(first[j]);
  for (size_t k = 1; k < inputs.size(); ++k) {
    const T* in = static_cast<const T*>(inputs[k]) + begin;
    for (int64_t j = 0; j < n; ++j) acc[j] = combine<kOp>(acc[j], Codec::load(in[j]));
  }
  if constexpr (kOp == ReduceOp::kAvg) {
    const float k = static_cast<float>(inputs.size());
    for (int64_t j = 0; j < n; ++j) acc[j] /= k;
  }
  T* dst = static_cast<T*>(out) + begin;
  for (int64_t j = 0; j < n; ++j) dst[j] = Codec::store(acc[j]);
}

template <ReduceOp kOp>
void reduce_int32_block(std::span<const void* const> inputs, void* out, int64_t begin, int64_t n) {
  int32_t acc[kBlock];
  std::memcpy(acc, static_cast<const int32_t*>(inputs[0]) + begin, n * sizeof(int32_t));
  for (size_t k = 1; k < inputs.size(); ++k) {
    const int32_t* in = static_cast<const int32_t*>(inputs[k]) + begin;
    for (int64_t j = 0; j < n; ++j) acc[j] = combine<kOp>(acc[j], in[j]);
  }
  std::memcpy(static_cast<int32_t*>(out) + begin, acc, n * sizeof(int32_t));
}

using BlockFn = void (*)(std::span<const void* const>, void*, int64_t, int64_t);

template <ReduceOp kOp>
BlockFn block_fn_for(DType dtype) {
  switch (dtype) {
    case DType::kF32: return reduce_float_block<F32Codec, kOp>;
    case DType::kBF16: return reduce_float_block<BF16Codec, kOp>;
    case DType::kF16: return reduce_float_block<F16Codec, kOp>;
    case DType::kI32: return kOp == ReduceOp::kAvg ? nullptr : reduce_int32_block<kOp>;
    default: return nullptr;
  }
}

BlockFn block_fn_for(DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return block_fn_for<ReduceOp::kSum>(dtype);
    case ReduceOp::kAvg: return block_fn_for<ReduceOp::kAvg>(dtype);
    case ReduceOp::kMax: return block_fn_for<ReduceOp::kMax>(dtype);
  }
  return nullptr;
}

// The CPU's reduction launched on the simulated device, reading every rank's buffer there.
absl::Status sim_reduce_in_rank_order(Device device, std::span<const void* const> inputs, void* out, int64_t count,
                                      DType dtype, ReduceOp op) {
  const auto on_device = [&](const void* p) { return Tensor(const_cast<void*>(p), dtype, {count}, device); };
  std::vector<Tensor> in;
  std::vector<Access> accesses;
  for (const void* p : inputs) {
    in.push_back(on_device(p));
    accesses.push_back(reads(in.back()));
  }
  const Tensor result = on_device(out);
  accesses.push_back(writes(result));
  return launch_on_sim(device, "reduce_in_rank_order", std::move(accesses),
                       [in, result, count, dtype, op](HostTensors& host) {
                         std::vector<const void*> host_inputs;
                         for (const Tensor& t : in) host_inputs.push_back(host(t).data());
                         return reduce_in_rank_order(Device::cpu(), host_inputs, host(result).data(), count, dtype, op);
                       });
}

}  // namespace

absl::Status reduce_in_rank_order(Device device, std::span<const void* const> inputs, void* out, int64_t count,
                                  DType dtype, ReduceOp op) {
  if (inputs.empty()) return absl::InvalidArgumentError("reduce_in_rank_order: no inputs");
  const BlockFn block = block_fn_for(dtype, op);
  if (block == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot ", reduce_op_name(op), "-reduce ", dtype_name(dtype)));
  }
  // One input reduces to its own values (widened and rounded back exactly; avg divides by 1): a copy, nothing in place,
  // so a one-rank group's allreduce and reduce-scatter cost no pass over the gradients. A NaN keeps its payload, as
  // NCCL's one-rank collectives keep it, where the rounding would have quieted it (bf16) or made it canonical (fp16).
  if (inputs.size() == 1) return queue_copy_bytes(device, out, inputs[0], count * dtype_size(dtype));
  if (device.is_sim()) return sim_reduce_in_rank_order(device, inputs, out, count, dtype, op);
  if (device.is_cuda()) {
#ifdef ZERO_HAS_CUDA
    return cuda_reduce_in_rank_order(device, inputs, out, count, dtype, op);
#else
    return absl::FailedPreconditionError("reduction on CUDA memory in a build without CUDA");
#endif
  }
  for (int64_t begin = 0; begin < count; begin += kBlock) block(inputs, out, begin, std::min(kBlock, count - begin));
  return absl::OkStatus();
}

absl::Status queue_copy_bytes(Device device, void* dst, const void* src, int64_t nbytes) {
  if (nbytes == 0 || dst == src) return absl::OkStatus();
  if (device.is_sim()) return sim_device().copy_async(dst, src, static_cast<size_t>(nbytes), current_stream(device));
  if (device.is_cuda()) {
#ifdef ZERO_HAS_CUDA
    return cuda_queue_copy_bytes(device, dst, src, nbytes);
#else
    return absl::FailedPreconditionError("copy of CUDA memory in a build without CUDA");
#endif
  }
  std::memcpy(dst, src, static_cast<size_t>(nbytes));
  return absl::OkStatus();
}

}  // namespace zero
