// LAMB as DeepSpeed's FusedLamb runs it: the trust ratio clamped to [min_coeff, max_coeff], and bias
// correction as a step-size factor after it (or none), against that kernel's formula in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "optim/optimizers.h"

namespace zero {
namespace {

constexpr double kLr = 0.01;
constexpr double kWeightDecay = 0.05;

struct FusedLambReference {  // deepspeed/csrc/lamb/fused_lamb_cuda_kernel.cu (eps outside the sqrt), in double
  LambOptions options;
  std::vector<double> m, v;

  void step(std::vector<double>& p, const std::vector<float>& g, int t) {
    const double b1 = options.beta1, b2 = options.beta2;
    std::vector<double> u(p.size());
    double p_sq = 0, u_sq = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      u[i] = m[i] / (std::sqrt(v[i]) + options.eps) + kWeightDecay * p[i];
      p_sq += p[i] * p[i];
      u_sq += u[i] * u[i];
    }
    double coeff = 1;
    if (p_sq > 0 && u_sq > 0) {
      coeff = std::clamp(std::sqrt(p_sq / u_sq), options.min_trust_ratio, options.max_trust_ratio);
    }
    const bool corrected = options.bias_correction == LambBiasCorrection::kStepSize;
    const double step_size = corrected ? kLr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t)) : kLr;
    for (size_t i = 0; i < p.size(); ++i) p[i] -= step_size * coeff * u[i];
  }
};

// Three steps of one decayed parameter of 6 elements whose values are `scale` times O(1): the trust ratio
// ||p|| / ||u|| is about `scale`, since Adam's u is O(1) per element.
void expect_fused_lamb_steps(const LambOptions& options, float scale) {
  const std::vector<float> p0 = {0.7f * scale, -1.1f * scale, 0.4f * scale, 1.3f * scale, -0.2f * scale, 0.9f * scale};
  const std::vector<std::vector<float>> grads = {{0.10f, -0.20f, 0.05f, 0.30f, -0.10f, 0.02f},
                                                 {0.12f, -0.15f, -0.05f, 0.25f, -0.08f, 0.04f},
                                                 {-0.02f, -0.22f, 0.06f, 0.28f, -0.12f, -0.03f}};
  const int64_t n = static_cast<int64_t>(p0.size());
  std::vector<FlatParam> params = {{"fc.weight", 0, n}};
  const std::vector<ParamGroup> groups = assign_decay_groups(params, static_cast<float>(kWeightDecay));
  Allocator allocator;
  absl::StatusOr<std::unique_ptr<Optimizer>> opt =
      make_lamb(options, *ShardLayout::create(params, groups, 0, n), allocator);
  ASSERT_TRUE(opt.ok()) << opt.status();

  std::vector<float> p = p0;
  FusedLambReference reference{options, std::vector<double>(n), std::vector<double>(n)};
  std::vector<double> want(p0.begin(), p0.end());
  for (int t = 1; t <= 3; ++t) {
    std::vector<float> g = grads[t - 1];
    ASSERT_TRUE(
        (*opt)
            ->step(Tensor(p.data(), DType::kF32, {n}), Tensor(g.data(), DType::kF32, {n}), t, static_cast<float>(kLr))
            .ok());
    reference.step(want, g, t);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(p[i], want[i], 1e-6 * std::max(std::fabs(want[i]), std::fabs(static_cast<double>(p0[i]))))
          << "step " << t << " element " << i;
    }
  }
}

const LambOptions kFusedLamb{.beta1 = 0.9,
                             .beta2 = 0.999,
                             .eps = 1e-8,
                             .bias_correction = LambBiasCorrection::kStepSize,
                             .min_trust_ratio = 0.01,
                             .max_trust_ratio = 10};

TEST(FusedLamb, BiasCorrectionScalesTheStepAfterTheTrustRatio) { expect_fused_lamb_steps(kFusedLamb, 1.0f); }

TEST(FusedLamb, WithoutBiasCorrectionTheStepIsLrTimesTheTrustRatio) {
  LambOptions options = kFusedLamb;
  options.bias_correction = LambBiasCorrection::kNone;
  expect_fused_lamb_steps(options, 1.0f);
}

TEST(FusedLamb, TheTrustRatioIsClampedToMaxCoeff) {
  LambOptions options = kFusedLamb;
  options.max_trust_ratio = 0.3;  // DeepSpeedExamples' BERT LAMB config; the ratio here is about 1
  expect_fused_lamb_steps(options, 1.0f);
  expect_fused_lamb_steps(kFusedLamb, 100.0f);  // a ratio near 100, clamped to 10
}

TEST(FusedLamb, TheTrustRatioIsClampedToMinCoeff) { expect_fused_lamb_steps(kFusedLamb, 1e-4f); }

TEST(FusedLamb, ARangeBelowZeroOrInvertedIsRefused) {
  std::vector<FlatParam> params = {{"fc.weight", 0, 4}};
  const std::vector<ParamGroup> groups = assign_decay_groups(params, 0.0f);
  Allocator allocator;
  LambOptions options = kFusedLamb;
  options.min_trust_ratio = 20;
  EXPECT_FALSE(make_lamb(options, *ShardLayout::create(params, groups, 0, 4), allocator).ok());
}

}  // namespace
}  // namespace zero
