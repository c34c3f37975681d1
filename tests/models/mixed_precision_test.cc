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
#include "tests/models/half_checks.h"
#include "tests/models/model_runner.h"

namespace zero {
namespace {

using testing::max_relative_error;
using testing::ModelRunner;
using testing::RunResult;
using testing::values;

const std::string kMlp = ZERO_FIXTURES_DIR "/mlp.safetensors";
const std::vector<int64_t> kMlpWidths = {16, 32, 32, 10};

// As fp32 runs are checked against the fp64 fixtures (gpt2_test.cc, mlp_test.cc).
constexpr double kFp32Tolerance = 1e-5;

std::string precision_name(const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); }

const auto kHalfFormats = ::testing::Values(DType::kBF16, DType::kF16);

// ---- GPT-2 ----

Gpt2Config tiny() { return *Gpt2Config::preset("tiny"); }

class Gpt2Precision : public ::testing::TestWithParam<DType> {};

// The fixture is float64 math on the fp32 weights, which load() rounds once to the format.
TEST_P(Gpt2Precision, LogitsLossAndGradientsMatchPyTorchWithinTheFormatsBound) {
  const DType half = GetParam();
  std::unique_ptr<Gpt2> model = *Gpt2::create(tiny());
  ModelRunner runner(*model, half);
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(testing::kGpt2TinyWeights, tiny());
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE(runner
                  .load([&](absl::string_view unit, absl::string_view param, const Tensor& dst) {
                    return reader->fill(unit, param, dst);
                  })
                  .ok());
  testing::expect_gpt2_matches_pytorch(runner, half, testing::loss_scale_for(half), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(HalfFormats, Gpt2Precision, kHalfFormats, precision_name);

// ---- MLP ----

class MlpPrecision : public ::testing::TestWithParam<DType> {};

TEST_P(MlpPrecision, LogitsAndGradientsMatchPyTorchWithinTheFormatsBound) {
  const DType half = GetParam();
  const float scale = testing::loss_scale_for(half);
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
  testing::expect_gradients_within(
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
