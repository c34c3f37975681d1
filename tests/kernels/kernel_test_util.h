// Test helpers for the kernels: random data, fp64 central differences, tolerance comparisons, views.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "runtime/allocator.h"
#include "runtime/device_memory.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/tensor.h"

namespace zero::kernels::testing {

// The unit roundoff of fp32.
inline constexpr double kU32 = 5.9604644775390625e-8;

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

// Finite values across the ranges that round differently to bf16 and fp16, and the specials: the casts' inputs.
inline std::vector<float> cast_inputs() {
  std::vector<float> x = random_floats(4096, 23, -70000.0f, 70000.0f);
  const std::vector<float> small = random_floats(4096, 24, -1e-4f, 1e-4f);  // fp16 subnormals
  x.insert(x.end(), small.begin(), small.end());
  for (float s : {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::denorm_min()}) {
    x.push_back(s);
  }
  return x;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

template <typename T>
Tensor view(std::vector<T>& v, Shape shape) {
  return Tensor(v.data(), DTypeOf<T>::value, std::move(shape));
}

// d loss / d x_i for every i by central differences in fp64. With h = 1e-5 the truncation error is
// O(h^2 f''') ~ 1e-10 and the rounding error O(eps64 |loss| / h) ~ 1e-10 for the O(1) losses used here,
// far below the fp32 errors of the kernels under test.
inline std::vector<double> numeric_grad(std::vector<double> x,
                                        const std::function<double(const std::vector<double>&)>& loss,
                                        double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss(x);
    x[i] = saved - h;
    const double down = loss(x);
    x[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// sum_i x_i * w_i: the scalar whose gradient with respect to an output x is w (the dout fed to backward).
inline double weighted_sum(const std::vector<double>& x, const std::vector<float>& w) {
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * w[i];
  return s;
}

// |actual_i - expected_i| <= tol for all i, reporting the first few misses.
template <typename A, typename E>
void expect_near_all(const std::vector<A>& actual, const std::vector<E>& expected, double tol,
                     const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < actual.size() && misses < 5; ++i) {
    const double a = static_cast<double>(actual[i]), e = static_cast<double>(expected[i]);
    if (!(std::fabs(a - e) <= tol)) {
      ADD_FAILURE() << what << "[" << i << "]: " << a << " vs expected " << e << " (tolerance " << tol << ")";
      ++misses;
    }
  }
}

// ---- The training precision (kernels.h): a bf16/fp16 call gives the fp32 call's bits on the widened tensors, rounded.

inline uint16_t round_to(DType half, float v) { return half == DType::kBF16 ? float_to_bf16(v) : float_to_fp16(v); }
inline float widen(DType half, uint16_t h) { return half == DType::kBF16 ? bf16_to_float(h) : fp16_to_float(h); }

// v with every element rounded to `half` (nearest even), as fp32: numbers both precisions hold exactly.
inline std::vector<float> representable(DType half, std::vector<float> v) {
  for (float& x : v) x = widen(half, round_to(half, x));
  return v;
}

// One tensor argument of a kernel: its starting values and shape; `fp32` ones (LayerNorm's mean and rstd, a matmul's
// fp32 results) stay fp32 in the half call.
struct KernelArg {
  std::vector<float> values;
  Shape shape;
  bool fp32 = false;
};

// Calls `kernel` on fp32 tensors holding args' values rounded to `half` (fp32 arguments: as given), and on `half`
// tensors holding the same numbers (fp32 arguments: a second fp32 copy), all on `device`; then every argument must
// hold, after the half call, the fp32 call's values rounded once to `half` (fp32 arguments: the same values), compared
// as bits.
inline void expect_half_gives_the_fp32_bits_rounded(
    DType half, const std::vector<KernelArg>& args,
    const std::function<absl::Status(const std::vector<Tensor>&)>& kernel, Device device = Device::cpu()) {
  Allocator allocator;
  std::vector<Buffer> buffers;
  const auto put = [&](const void* host, DType dtype, const Shape& shape) {
    absl::StatusOr<Buffer> buffer =
        allocator.allocate(shape_numel(shape) * dtype_size(dtype), MemoryCategory::kWorkspace, device);
    ZERO_CHECK(buffer.ok(), buffer.status().ToString());
    const Tensor t = buffer->tensor(dtype, shape);
    const absl::Status copied = copy_bytes(t.data(), device, host, Device::cpu(), t.nbytes());
    ZERO_CHECK(copied.ok(), copied.ToString());
    buffers.push_back(*std::move(buffer));
    return t;
  };
  std::vector<Tensor> fp32_tensors, half_tensors;
  for (const KernelArg& a : args) {
    const std::vector<float> wide = a.fp32 ? a.values : representable(half, a.values);
    fp32_tensors.push_back(put(wide.data(), DType::kF32, a.shape));
    std::vector<uint16_t> bits(wide.size());
    for (size_t i = 0; i < wide.size(); ++i) bits[i] = round_to(half, wide[i]);
    half_tensors.push_back(a.fp32 ? put(wide.data(), DType::kF32, a.shape) : put(bits.data(), half, a.shape));
  }
  const absl::Status fp32_status = kernel(fp32_tensors);
  ASSERT_TRUE(fp32_status.ok()) << fp32_status;
  const absl::Status half_status = kernel(half_tensors);
  ASSERT_TRUE(half_status.ok()) << half_status;
  for (size_t k = 0; k < args.size(); ++k) {
    std::vector<float> fp32(args[k].values.size()), got(fp32.size());
    ASSERT_TRUE(copy_bytes(fp32.data(), Device::cpu(), fp32_tensors[k].data(), device, fp32_tensors[k].nbytes()).ok());
    std::vector<uint16_t> bits(fp32.size());
    void* const out = args[k].fp32 ? static_cast<void*>(got.data()) : bits.data();
    ASSERT_TRUE(copy_bytes(out, Device::cpu(), half_tensors[k].data(), device, half_tensors[k].nbytes()).ok());
    int misses = 0;
    for (size_t i = 0; i < fp32.size() && misses < 5; ++i) {
      const float want = args[k].fp32 ? fp32[i] : widen(half, round_to(half, fp32[i]));
      if (!args[k].fp32) got[i] = widen(half, bits[i]);
      if (std::memcmp(&want, &got[i], sizeof(float)) != 0) {
        ADD_FAILURE() << dtype_name(half) << " on " << device.to_string() << ", argument " << k << "[" << i
                      << "]: " << got[i] << ", expected " << want << " (the fp32 call's " << fp32[i]
                      << (args[k].fp32 ? ")" : ", rounded)");
        ++misses;
      }
    }
  }
}

}  // namespace zero::kernels::testing
