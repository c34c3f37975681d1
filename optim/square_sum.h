// Exact sums of squares of fp32 values, so whole-parameter norms do not depend on how a parameter is split.
#pragma once

// Why exact: LAMB/LARS need ||w|| and ||update|| of each whole parameter, and a parameter may straddle
// ranks. Floating-point partial sums over different splits (N = 1 vs N = 3, or different thread counts)
// round differently, so sharded could not equal unsharded bit for bit. Instead each square x^2 of an
// fp32 x = m * 2^(e-150) is the integer m^2 (< 2^48) at bit 2e-300, and sums are kept as a fixed-point
// integer (bit 0 = 2^-298, the smallest square) with no rounding at all. Integer addition is associative,
// so every split gives the same integer, which is then rounded to double once. Across ranks the integer
// travels as 16-bit limbs in int32 words, summed by one int32 allreduce without overflow for < 2^15 ranks,
// and carries are propagated afterwards.

#include <array>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "runtime/dtype.h"
#include "runtime/host_device.h"
#include "runtime/tensor.h"

namespace zero {

// Where x^2 goes, shared by the CPU bins and the CUDA kernels: slots 1..254 are fp32 exponents and get the
// exact integer m^2 (fp32 subnormals share exponent 1's scale without the hidden bit); NaN and infinity
// are counted (amount 1) in slots kNanSlot and kInfSlot.
inline constexpr int kNanSlot = 256;
inline constexpr int kInfSlot = 257;
inline constexpr int kSquareSlots = 258;
ZERO_HD int square_slot(float x, uint64_t& amount) {
  const uint32_t u = float_bits(x);
  const uint32_t e = (u >> 23) & 0xffu;
  const uint64_t m = (u & 0x7fffffu) | (e != 0 ? 0x800000u : 0u);
  if (e == 0xffu) {
    amount = 1;
    return (m & 0x7fffffu) != 0 ? kNanSlot : kInfSlot;
  }
  amount = m * m;
  return e == 0 ? 1 : static_cast<int>(e);
}

// Exact squares of at most kMaxBinnedValues values, binned by fp32 exponent (the hot inner loop).
struct SquareBins {
  static constexpr int64_t kMaxBinnedValues = int64_t{1} << 16;  // 2^16 * (2^24-1)^2 < 2^64 per bin
  std::array<uint64_t, 256> bins{};
  uint32_t nan = 0;
  uint32_t inf = 0;

  void add(float x) {
    uint64_t amount;
    const int slot = square_slot(x, amount);
    if (slot < 256) {
      bins[slot] += amount;
    } else {
      slot == kNanSlot ? ++nan : ++inf;
    }
  }
};

class SquareSum {
 public:
  static constexpr int kLimbs = 22;                 // 32-bit limbs: 704 bits cover 2^-298 .. beyond any sum
  static constexpr int kWireInts = 2 * kLimbs + 2;  // 16-bit limbs, then NaN and infinity flags

  void add(const SquareBins& bins);
  void merge(const SquareSum& other);
  // Writes kWireInts words, each in [0, 2^16), ready for an int32 sum allreduce.
  void to_wire(int32_t* out) const;
  // The sum of the wires of all ranks.
  static SquareSum from_wire(const int32_t* in);
  // The exact sum rounded to double; +inf if any value was infinite, NaN if any was NaN.
  double value() const;

 private:
  void normalize();

  std::array<uint64_t, kLimbs> limbs_{};  // 32-bit payload each between normalizations
  uint64_t nan_ = 0;
  uint64_t inf_ = 0;
};

// The exact sum of squares of x[i] / divisor (divided in fp32, as SquareBins::add(load_as_float(x, i) / divisor))
// over contiguous fp32, bf16 or fp16 tensors of any shape, all on one device. CPU tensors are binned here in
// chunks of kMaxBinnedValues over the OpenMP threads; CUDA tensors on their device (optim/cuda/), their bins read
// back together; simulated-device tensors by the CPU code in one launch. The host waits once for the result, not
// once per tensor: a step's gradients of every unit cost one read. Every split gives the same integers.
absl::StatusOr<SquareSum> exact_square_sum(std::span<const Tensor> xs, float divisor);
inline absl::StatusOr<SquareSum> exact_square_sum(const Tensor& x, float divisor) {
  return exact_square_sum(std::span<const Tensor>(&x, 1), divisor);
}

}  // namespace zero
