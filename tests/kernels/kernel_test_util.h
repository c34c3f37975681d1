// Test helpers for the kernels: random data, fp64 central differences, tolerance comparisons, views.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
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

}  // namespace zero::kernels::testing
