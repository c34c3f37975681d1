// Checks of a bf16/fp16 model run against the PyTorch fixtures, within the bounds of half_bounds.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "models/gpt2_config.h"
#include "models/gpt2_weights.h"
#include "runtime/dtype.h"
#include "tests/models/compare.h"
#include "tests/models/gpt2_fixture.h"
#include "tests/models/half_bounds.h"
#include "tests/models/model_runner.h"

namespace zero::testing {

// The loss scale the tests run `half` with: 1 for bf16, 1024 for fp16. A power of two, so the scaled gradients are the
// unscaled ones times it exactly (gpt2_test.cc's LossScaleMultipliesEveryGradientExactly) and dividing it back out of
// a half gradient is exact too. fp16's largest finite value is 65504 and the tiny models' largest |gradient| is below
// 1 (expect_gradients_within asserts it): 1024 keeps every scaled gradient below 1024, far from overflow, and lifts
// the small ones out of fp16's subnormals (< 2^-14).
inline float loss_scale_for(DType half) { return half == DType::kF16 ? 1024.0f : 1.0f; }

// A tensor's elements as fp32 (exact from any floating dtype).
inline std::vector<float> values(const Tensor& t) {
  std::vector<float> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = load_as_float(t.data(), t.dtype(), i);
  return out;
}

// A run's gradients, unscaled, against the fixture's: each within `bound` (max_relative_error), every one finite and
// below 1 in magnitude. `want(unit, param)` gives the fixture's. Prints the worst.
inline void expect_gradients_within(
    ModelRunner& runner, float scale, double bound,
    const std::function<std::vector<float>(const std::string&, const std::string&)>& want, const std::string& what) {
  double worst = 0, largest = 0;
  std::string worst_name;
  runner.for_each_param([&](const std::string& unit, const std::string& param) {
    std::vector<float> unscaled = values(runner.grad(unit, param));
    for (float& g : unscaled) {
      g /= scale;  // a power of two: exact
      ASSERT_TRUE(std::isfinite(g)) << unit << "." << param;
      largest = std::max(largest, std::fabs(static_cast<double>(g)));
    }
    const double err = max_relative_error(unscaled, want(unit, param));
    EXPECT_LT(err, bound) << unit << "." << param;
    if (err > worst) worst = err, worst_name = unit + "." + param;
  });
  EXPECT_LT(largest, 1.0) << "the loss scale's premise";
  std::printf("[ %s ] worst gradient %s %.3g, bound %.3g\n", what.c_str(), worst_name.c_str(), worst, bound);
}

// One forward and backward of `runner` (the tiny GPT-2 holding the fixture's weights in `half`, bf16 or fp16, on any
// device) on the fixture's batch, held to PyTorch's float64 logits, loss and gradients within the format's bound, the
// loss scale (a power of two) divided back out of the gradients. The fixture is float64 math on the fp32 weights,
// which load() rounded once to the format; `fp32_tolerance` is what the run's fp32 math may add. Prints the figures.
inline void expect_gpt2_matches_pytorch(ModelRunner& runner, DType half, float scale, double fp32_tolerance) {
  const Gpt2Config c = *Gpt2Config::preset("tiny");
  const Roundings roundings = gpt2_roundings(static_cast<int>(c.num_layers), true);
  const double forward = forward_bound(half, roundings, fp32_tolerance);
  Gpt2FixtureBatch f = load_gpt2_fixture_batch();
  Allocator alloc;
  absl::StatusOr<RunResult> r = runner.forward_backward(alloc, f.batch, scale);
  ASSERT_TRUE(r.ok()) << r.status();

  std::vector<float> logits, want_logits = values(*f.io.get("logits"));
  for (int64_t row = 0; row < 2 * 8; ++row) {
    const float* begin = r->logits.data() + row * c.padded_vocab_size;
    logits.insert(logits.end(), begin, begin + c.vocab_size);
  }
  const double logits_err = max_relative_error(logits, want_logits);
  EXPECT_LT(logits_err, forward);
  // Cross-entropy's gradient in the logits, p - onehot, has |.|_1 <= 2 per row: the mean loss moves by
  // at most twice the largest logit change.
  double max_logit = 0;
  for (float z : want_logits) max_logit = std::max(max_logit, std::fabs(static_cast<double>(z)));
  const float want_loss = *f.io.get("loss")->data_as<float>();
  EXPECT_LE(std::fabs(r->loss - want_loss), 2 * forward * max_logit);
  std::printf("[ %s ] logits %.3g, bound %.3g (%.1f u); loss %.7g vs %.7g\n", std::string(dtype_name(half)).c_str(),
              logits_err, forward, forward / unit_roundoff(half), r->loss, want_loss);

  absl::StatusOr<Gpt2HfReader> grads = Gpt2HfReader::open(kGpt2TinyGrads, c);
  ASSERT_TRUE(grads.ok()) << grads.status();
  expect_gradients_within(
      runner, scale, gradient_bound(half, roundings, fp32_tolerance),
      [&](const std::string& unit, const std::string& param) {
        std::vector<float> want(runner.grad(unit, param).numel());
        EXPECT_TRUE(grads->fill(unit, param, Tensor(want.data(), DType::kF32, runner.grad(unit, param).shape())).ok());
        return want;
      },
      absl::StrCat(dtype_name(half), " GPT-2"));
}

}  // namespace zero::testing
