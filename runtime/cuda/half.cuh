// fp32 <-> bf16/fp16 on the device with runtime/dtype.h's exact bits (NaNs included), and typed element access.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "runtime/dtype.h"

namespace zero {

// Nearest-even as runtime/dtype.h's float_to_bf16 / float_to_fp16: the hardware conversion rounds the
// same way but canonicalises NaN, so NaNs take the CPU's path (bf16: payload kept, quiet bit set; fp16:
// sign kept, canonical quiet NaN).
__device__ __forceinline__ uint16_t to_bf16(float v) {
  return isnan(v) ? static_cast<uint16_t>((__float_as_uint(v) >> 16) | 0x40u)
                  : __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
__device__ __forceinline__ uint16_t to_fp16(float v) {
  const uint16_t sign = static_cast<uint16_t>((__float_as_uint(v) >> 16) & 0x8000u);
  return isnan(v) ? static_cast<uint16_t>(sign | 0x7e00u) : __half_as_ushort(__float2half_rn(v));
}

// Exact widening as runtime/dtype.h: fp16 NaNs keep sign and payload (the hardware canonicalises them).
__device__ __forceinline__ float from_bf16(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
__device__ __forceinline__ float from_fp16(uint16_t h) {
  if ((h & 0x7fffu) > 0x7c00u) {
    return __uint_as_float((static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
  }
  return __half2float(__ushort_as_half(h));
}

// The CUDA type of one element of floating dtype T.
template <DType T>
using DeviceElement =
    std::conditional_t<T == DType::kF32, float, std::conditional_t<T == DType::kBF16, __nv_bfloat16, __half>>;

// Element i of a T buffer as fp32, and v stored into it rounded to nearest even: runtime/dtype.h's
// load_as_float / store_from_float with T fixed at compile time.
template <DType T>
__device__ __forceinline__ float load_float(const void* p, int64_t i) {
  if constexpr (T == DType::kBF16)
    return from_bf16(static_cast<const uint16_t*>(p)[i]);
  else if constexpr (T == DType::kF16)
    return from_fp16(static_cast<const uint16_t*>(p)[i]);
  else
    return static_cast<const float*>(p)[i];
}
template <DType T>
__device__ __forceinline__ void store_float(void* p, int64_t i, float v) {
  if constexpr (T == DType::kBF16)
    static_cast<uint16_t*>(p)[i] = to_bf16(v);
  else if constexpr (T == DType::kF16)
    static_cast<uint16_t*>(p)[i] = to_fp16(v);
  else
    static_cast<float*>(p)[i] = v;
}

// v as a T buffer holds it after store_float<T>(v): rounded to T once and widened back (v itself for fp32).
template <DType T>
__device__ __forceinline__ float rounded(float v) {
  if constexpr (T == DType::kBF16)
    return from_bf16(to_bf16(v));
  else if constexpr (T == DType::kF16)
    return from_fp16(to_fp16(v));
  else
    return v;
}

}  // namespace zero
