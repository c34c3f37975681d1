#include "tests/runtime/comm_test_util.h"

#include <cmath>
#include <cstring>
#include <random>

namespace zero::testing {

std::vector<uint8_t> rank_data(DType dtype, int64_t count, int rank, uint64_t seed) {
  std::vector<uint8_t> bytes(count * dtype_size(dtype));
  std::mt19937_64 rng(seed * 1000003 + rank);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  for (int64_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DType::kF32:
      case DType::kBF16:
      case DType::kF16: {
        const float v = uniform(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 7) - 3);
        // Round through the dtype so the value is exactly representable.
        uint16_t h = dtype == DType::kBF16 ? float_to_bf16(v) : float_to_fp16(v);
        if (dtype == DType::kF32) {
          std::memcpy(&bytes[i * 4], &v, 4);
        } else {
          std::memcpy(&bytes[i * 2], &h, 2);
        }
        break;
      }
      case DType::kI32: {
        const int32_t v = static_cast<int32_t>(rng());
        std::memcpy(&bytes[i * 4], &v, 4);
        break;
      }
      default:
        bytes[i * dtype_size(dtype)] = static_cast<uint8_t>(rng());
        if (dtype_size(dtype) == 2) bytes[i * 2 + 1] = static_cast<uint8_t>(rng());
    }
  }
  return bytes;
}

std::vector<uint8_t> reference_reduce(const std::vector<std::vector<uint8_t>>& per_rank, DType dtype, int64_t count,
                                      ReduceOp op) {
  std::vector<uint8_t> out(count * dtype_size(dtype));
  const int n = static_cast<int>(per_rank.size());
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == DType::kI32) {
      int32_t acc;
      std::memcpy(&acc, &per_rank[0][i * 4], 4);
      for (int r = 1; r < n; ++r) {
        int32_t v;
        std::memcpy(&v, &per_rank[r][i * 4], 4);
        acc = op == ReduceOp::kMax ? std::max(acc, v)
                                   : static_cast<int32_t>(static_cast<uint32_t>(acc) + static_cast<uint32_t>(v));
      }
      std::memcpy(&out[i * 4], &acc, 4);
      continue;
    }
    float acc = load_as_float(per_rank[0].data(), dtype, i);
    for (int r = 1; r < n; ++r) {
      const float v = load_as_float(per_rank[r].data(), dtype, i);
      acc = op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
    }
    if (op == ReduceOp::kAvg) acc /= static_cast<float>(n);
    store_from_float(out.data(), dtype, i, acc);
  }
  return out;
}

std::vector<uint8_t> chunk_of(const std::vector<uint8_t>& bytes, DType dtype, int64_t count, int chunk) {
  const size_t chunk_bytes = count * dtype_size(dtype);
  return std::vector<uint8_t>(bytes.begin() + chunk * chunk_bytes, bytes.begin() + (chunk + 1) * chunk_bytes);
}

}  // namespace zero::testing
