// Element types zero stores and moves, with exact fp32 <-> bf16/fp16 conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include "absl/strings/string_view.h"

namespace zero {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kU16, kU8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: case DType::kU16: return 2;
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

constexpr bool is_floating(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

// Maps a C++ element type to its DType.
template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<uint16_t> { static constexpr DType value = DType::kU16; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kU8; };

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// bf16 is the top half of an fp32; rounding is to nearest, ties to even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// IEEE binary16, round to nearest even, with subnormals, infinities and NaN.
inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;                      // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;                     // rounds to >= 65520: inf
  if (abs >= 0x38800000u) {                                          // normal half
    const uint32_t mant_odd = (abs >> 13) & 1u;
    const uint32_t rounded = abs + 0xfffu + mant_odd;
    return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
  }
  // Subnormal half (or zero): scale so the half's ulp (2^-24) becomes 1 and round.
  const float scaled = bits_float(abs) * 16777216.0f;  // exact: power of two
  const uint32_t whole = static_cast<uint32_t>(scaled);
  const float frac = scaled - static_cast<float>(whole);
  uint32_t result = whole;
  if (frac > 0.5f || (frac == 0.5f && (whole & 1u))) ++result;
  return sign | static_cast<uint16_t>(result);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24, exact
    return bits_float(float_bits(v) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

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
