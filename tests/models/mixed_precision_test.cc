// bf16/fp16 model paths: every unit computes in its parameters' dtype, each kernel in fp32 with one rounding of what
// it writes (kernels/kernels.h). Pinned against the PyTorch fixtures within the bound that rounding allows
// (tests/models/half_bounds.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "models/gpt2.h"
#include "models/gpt2_weights.h"
#include "models/mlp.h"
#include "runtime/dtype.h"
#include "runtime/safetensors.h"
#include "runtime/status.h"
#include "tests/models/compare.h"
#include "tests/models/gpt2_fixture.h"
#include "tests/models/half_bounds.h"
#include "tests/models/model_runner.h"

namespace zero {
namespace {

using testing::max_relative_error;
using testing::ModelRunner;
using testing::RunResult;
using testing::unit_roundoff;

const std::string kMlp = ZERO_FIXTURES_DIR "/mlp.safetensors";
const std::vector<int64_t> kMlpWidths = {16, 32, 32, 10};

// A tensor's elements as fp32 (exact from any floating dtype).
std::vector<float> values(const Tensor& t) {
  std::vector<float> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = load_as_float(t.data(), t.dtype(), i);
  return out;
}

// As fp32 runs are checked against the fp64 fixtures (gpt2_test.cc, mlp_test.cc).
constexpr double kFp32Tolerance = 1e-5;

struct Precision {
  DType dtype;
  // A power of two, so the scaled gradients are the unscaled ones times it exactly (gpt2_test.cc's
  // LossScaleMultipliesEveryGradientExactly) and dividing it back out of a half gradient is exact too.
  // fp16's largest finite value is 65504 and the tiny GPT-2's largest |gradient| is below 1 (asserted
  // below): 1024 keeps every scaled gradient below 1024, far from overflow, and lifts the small ones
  // out of fp16's subnormals (< 2^-14).
  float loss_scale;
};

std::string precision_name(const ::testing::TestParamInfo<Precision>& info) {
  return std::string(dtype_name(info.param.dtype));
}

const auto kHalfFormats = ::testing::Values(Precision{DType::kBF16, 1.0f}, Precision{DType::kF16, 1024.0f});

// A run's gradients, unscaled, against the fixture's: each within `bound` (max_relative_error), every one finite and
// below 1 in magnitude. `want(unit, param)` gives the fixture's. Prints the worst.
void expect_gradients_within(ModelRunner& runner, float scale, double bound,
                             const std::function<std::vector<float>(const std::string&, const std::string&)>& want,
                             const std::string& what) {
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

// ---- GPT-2 ----

Gpt2Config tiny() { return *Gpt2Config::preset("tiny"); }

class Gpt2Precision : public ::testing::TestWithParam<Precision> {};

// The fixture is float64 math on the fp32 weights, which load() rounds once to the format.
TEST_P(Gpt2Precision, LogitsLossAndGradientsMatchPyTorchWithinTheFormatsBound) {
  const auto [half, scale] = GetParam();
  const Gpt2Config c = tiny();
  const testing::Roundings roundings = testing::gpt2_roundings(static_cast<int>(c.num_layers), true);
  const double forward = testing::forward_bound(half, roundings, kFp32Tolerance);
  testing::Gpt2FixtureBatch f = testing::load_gpt2_fixture_batch();
  std::unique_ptr<Gpt2> model = *Gpt2::create(c);
  ModelRunner runner(*model, half);
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(testing::kGpt2TinyWeights, c);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE(runner
                  .load([&](absl::string_view unit, absl::string_view param, const Tensor& dst) {
                    return reader->fill(unit, param, dst);
                  })
                  .ok());
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

  absl::StatusOr<Gpt2HfReader> grads = Gpt2HfReader::open(testing::kGpt2TinyGrads, c);
  ASSERT_TRUE(grads.ok()) << grads.status();
  expect_gradients_within(
      runner, scale, testing::gradient_bound(half, roundings, kFp32Tolerance),
      [&](const std::string& unit, const std::string& param) {
        std::vector<float> want(runner.grad(unit, param).numel());
        EXPECT_TRUE(grads->fill(unit, param, Tensor(want.data(), DType::kF32, runner.grad(unit, param).shape())).ok());
        return want;
      },
      absl::StrCat(dtype_name(half), " GPT-2"));
}

INSTANTIATE_TEST_SUITE_P(HalfFormats, Gpt2Precision, kHalfFormats, precision_name);

// ---- MLP ----

class MlpPrecision : public ::testing::TestWithParam<Precision> {};

TEST_P(MlpPrecision, LogitsAndGradientsMatchPyTorchWithinTheFormatsBound) {
  const auto [half, scale] = GetParam();
  const testing::Roundings roundings = testing::mlp_roundings(static_cast<int>(kMlpWidths.size()) - 1, true);
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(kMlp);
  ASSERT_TRUE(file.ok()) << file.status();
  std::unique_ptr<Mlp> model = *Mlp::create(kMlpWidths);
  ModelRunner runner(*model, half);
  ASSERT_TRUE(runner
                  .load([&](absl::string_view unit, absl::string_view param, const Tensor& dst) {
                    ZERO_ASSIGN_OR_RETURN(Tensor src,
                                          file->get(absl::StrCat(unit, ".", param), DType::kF32, dst.shape()));
                    std::copy_n(src.data_as<float>(), src.numel(), dst.data_as<float>());
                    return absl::OkStatus();
                  })
                  .ok());
  const Batch batch{.inputs = *file->get("inputs"), .targets = *file->get("targets")};
  Allocator alloc;
  absl::StatusOr<RunResult> r = runner.forward_backward(alloc, batch, scale);
  ASSERT_TRUE(r.ok()) << r.status();
  const double logits_err = max_relative_error(r->logits, values(*file->get("logits")));
  EXPECT_LT(logits_err, testing::forward_bound(half, roundings, kFp32Tolerance));
  expect_gradients_within(
      runner, scale, testing::gradient_bound(half, roundings, kFp32Tolerance),
      [&](const std::string& unit, const std::string& param) {
        return values(
            *file->get(absl::StrCat("grad.", unit, ".", param), DType::kF32, runner.grad(unit, param).shape()));
      },
      absl::StrCat(dtype_name(half), " MLP"));
}

INSTANTIATE_TEST_SUITE_P(HalfFormats, MlpPrecision, kHalfFormats, precision_name);

}  // namespace
}  // namespace zero
