// Element types zero stores and moves, with exact fp32 <-> bf16/fp16 conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <type_traits>
#include "absl/strings/string_view.h"
#include "runtime/host_device.h"

namespace zero {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kU16, kU8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kBF16:
    case DType::kF16:
    case DType::kU16: return 2;
    case DType::kU8: return 1;
  }
  return 0;
}

constexpr absl::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
    case DType::kI32: return "int32";
    case DType::kU16: return "uint16";
    case DType::kU8: return "uint8";
  }
  return "?";
}

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

constexpr bool is_floating(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// Maps a C++ element type to its DType.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<uint16_t> {
  static constexpr DType value = DType::kU16;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kU8;
};

// The bits of an fp32 and back, on the host and on CUDA devices.
ZERO_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
ZERO_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// bf16 is the top half of an fp32; rounding is to nearest, ties to even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// Branch-free selection, which compilers keep as masks (a ternary over floating-point results is
// turned back into a branch, and a loop with a branch does not vectorize).
inline uint32_t all_ones_if(bool c) { return 0u - static_cast<uint32_t>(c); }
inline uint32_t select_bits(uint32_t mask, uint32_t if_set, uint32_t if_clear) {
  return (if_set & mask) | (if_clear & ~mask);
}

// IEEE binary16, round to nearest even, with subnormals, infinities and NaN (quiet 0x7e00). Written
// without branches (every case computed, one selected) so loops over buffers vectorize; the subnormal
// case lets the fp32 adder do the rounding: adding 0.5 puts the half's ulp, 2^-24, at fp32's last bit.
inline uint16_t float_to_fp16(float f) {
  constexpr uint32_t kHalf = 0x3f000000u;  // 0.5f
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  // Rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even; a carry out of the
  // mantissa raises the exponent, up to infinity for [65520, 65536).
  const uint32_t normal = (abs - 0x38000000u + 0xfffu + ((abs >> 13) & 1u)) >> 13;
  const uint32_t subnormal = float_bits(bits_float(abs) + bits_float(kHalf)) - kHalf;
  const uint32_t inf_or_nan = 0x7c00u | (all_ones_if(abs > 0x7f800000u) & 0x0200u);
  const uint32_t finite = select_bits(all_ones_if(abs < 0x38800000u), subnormal, normal);
  return static_cast<uint16_t>(sign | select_bits(all_ones_if(abs >= 0x47800000u), inf_or_nan, finite));
}

// Exact. Branch-free like float_to_fp16: the exponent is rebiased (15 -> 127) for every input, then
// infinities/NaN get the rest of the way to 255 and subnormals are renormalized by one exact subtraction.
inline float fp16_to_float(uint16_t h) {
  const uint32_t shifted = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa in place
  const uint32_t exponent = shifted & 0x0f800000u;
  const uint32_t normal = shifted + (112u << 23);
  const uint32_t inf_or_nan = normal + (112u << 23);
  const uint32_t subnormal = float_bits(bits_float(normal + (1u << 23)) - bits_float(113u << 23));
  const uint32_t finite = select_bits(all_ones_if(exponent == 0), subnormal, normal);
  const uint32_t magnitude = select_bits(all_ones_if(exponent == 0x0f800000u), inf_or_nan, finite);
  return bits_float(magnitude | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

// The C++ type that holds one element of floating dtype T: a float, or the 16 bits of a bf16 or fp16.
template <DType T>
using StorageOf = std::conditional_t<T == DType::kF32, float, uint16_t>;

// Reads element i of a floating buffer of type t as fp32 (exact for all three types).
inline float load_as_float(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Writes fp32 value v into element i of a floating buffer of type t, rounding to nearest even.
inline void store_from_float(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = float_to_fp16(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

}  // namespace zero
