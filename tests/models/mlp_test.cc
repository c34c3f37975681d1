// The MLP's units: loss, logits and every gradient against PyTorch, loss scaling, memory returned, input errors.
#include "models/mlp.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/safetensors.h"
#include "runtime/status.h"
#include "tests/models/compare.h"
#include "tests/models/model_runner.h"

namespace zero {
namespace {

using testing::floats_of;
using ::testing::HasSubstr;
using testing::max_relative_error;
using testing::ModelRunner;
using testing::RunResult;

const std::string kFixture = ZERO_FIXTURES_DIR "/mlp.safetensors";
const std::vector<int64_t> kWidths = {16, 32, 32, 10};

struct Loaded {
  SafetensorsFile file;
  std::unique_ptr<Mlp> model;
  std::unique_ptr<ModelRunner> runner;
  Batch batch;  // inputs (8, 16), targets (8)
};

Loaded load() {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(kFixture);
  EXPECT_TRUE(file.ok()) << file.status();
  Loaded l{.file = *std::move(file), .model = *Mlp::create(kWidths)};
  l.runner = std::make_unique<ModelRunner>(*l.model);
  const absl::Status s = l.runner->load([&](absl::string_view unit, absl::string_view param, const Tensor& dst) {
    ZERO_ASSIGN_OR_RETURN(Tensor src, l.file.get(absl::StrCat(unit, ".", param), DType::kF32, dst.shape()));
    std::copy_n(src.data_as<float>(), src.numel(), dst.data_as<float>());
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  l.batch = {.inputs = *l.file.get("inputs"), .targets = *l.file.get("targets")};
  return l;
}

// The fixture is float64 math on fp32 parameters; zero's fp32 sums have at most 32 terms, each off by
// ~sqrt(32)·2^-24 ~ 3e-7 of the magnitudes summed, in about ten chained steps: ~1e-6 of a tensor's
// scale (the largest seen is 2.3e-7). 1e-5 still catches any wrong term, which is an O(1) error.
constexpr double kTolerance = 1e-5;

TEST(Mlp, LossLogitsAndEveryGradientMatchPyTorch) {
  Loaded l = load();
  Allocator alloc;
  absl::StatusOr<RunResult> r = l.runner->forward_backward(alloc, l.batch);
  ASSERT_TRUE(r.ok()) << r.status();
  const float want_loss = *l.file.get("loss")->data_as<float>();
  EXPECT_NEAR(r->loss, want_loss, kTolerance * want_loss);
  EXPECT_EQ(r->predictions, 8);
  ASSERT_EQ(r->logits_shape, Shape({8, 10}));
  EXPECT_LT(max_relative_error(r->logits, floats_of(*l.file.get("logits"))), kTolerance);
  int checked = 0;
  l.runner->for_each_param([&](const std::string& unit, const std::string& param) {
    const Tensor got = l.runner->grad(unit, param);
    absl::StatusOr<Tensor> want = l.file.get(absl::StrCat("grad.", unit, ".", param), DType::kF32, got.shape());
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_LT(max_relative_error(floats_of(got), floats_of(*want)), kTolerance) << unit << "." << param;
    ++checked;
  });
  EXPECT_EQ(checked, 6);
}

TEST(Mlp, AccuracyCountsArgmaxHits) {
  Loaded l = load();
  Allocator alloc;
  absl::StatusOr<RunResult> r = l.runner->forward_backward(alloc, l.batch);
  ASSERT_TRUE(r.ok());
  const int32_t* targets = l.batch.targets.data_as<int32_t>();
  int64_t hits = 0;
  for (int64_t row = 0; row < 8; ++row) {
    const float* logits = r->logits.data() + row * 10;
    hits += std::max_element(logits, logits + 10) - logits == targets[row];
  }
  EXPECT_EQ(r->correct, hits);
}

TEST(Mlp, LossScaleMultipliesEveryGradientExactly) {
  // Backward is linear in d(loss)/d(logits): a power-of-two scale scales every rounded result exactly.
  Loaded plain = load(), scaled = load();
  Allocator alloc;
  ASSERT_TRUE(plain.runner->forward_backward(alloc, plain.batch).ok());
  ASSERT_TRUE(scaled.runner->forward_backward(alloc, scaled.batch, 256.0f).ok());
  std::vector<float> want = plain.runner->all_grads();
  for (float& g : want) g *= 256.0f;
  EXPECT_EQ(scaled.runner->all_grads(), want);
}

TEST(Mlp, BackwardReturnsAllActivationsAndWorkspace) {
  Loaded l = load();
  Allocator alloc;
  ASSERT_TRUE(l.runner->forward_backward(alloc, l.batch).ok());
  const MemoryStats m = alloc.stats();
  // Each layer keeps (B, out) twice: pre-activation and activation (the last: logits and their gradient).
  EXPECT_EQ(m.peak_of(MemoryCategory::kActivations), 4 * 2 * 8 * (32 + 32 + 10));
  EXPECT_EQ(m.current_of(MemoryCategory::kActivations), 0);
  EXPECT_EQ(m.current_of(MemoryCategory::kWorkspace), 0);
}

TEST(Mlp, WrongInputWidthIsNamed) {
  Loaded l = load();
  std::vector<float> inputs(8 * 15);
  const Batch batch{.inputs = Tensor(inputs.data(), DType::kF32, {8, 15}), .targets = l.batch.targets};
  Allocator alloc;
  const absl::Status s = l.runner->forward_backward(alloc, batch).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("MLP layer fc0 takes fp32 (B, 16) inputs"));
}

TEST(Mlp, LabelOutsideTheClassesIsAnError) {
  Allocator alloc;  // outlives the model: a failed forward leaves earlier layers' activations held
  Loaded l = load();
  std::vector<int32_t> targets(8, 0);
  targets[5] = 10;
  const Batch batch{.inputs = l.batch.inputs, .targets = Tensor(targets.data(), DType::kI32, {8})};
  EXPECT_THAT(std::string(l.runner->forward_backward(alloc, batch).status().message()),
              HasSubstr("target 10 at 5 outside [0, 10)"));
}

TEST(Mlp, BatchOnAnotherDeviceThanTheUnitsIsAnError) {
  Allocator alloc;    // outlives the model: a failed forward leaves earlier layers' activations held
  Loaded l = load();  // runs on the CPU
  // Host memory labelled cuda:0: refused before anything reads it.
  const Tensor inputs_on_gpu(l.batch.inputs.data(), DType::kF32, l.batch.inputs.shape(), Device::cuda(0));
  const Tensor targets_on_gpu(l.batch.targets.data(), DType::kI32, l.batch.targets.shape(), Device::cuda(0));
  absl::Status s = l.runner->forward_backward(alloc, {.inputs = inputs_on_gpu, .targets = l.batch.targets}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("the MLP's inputs (ctx.batch.inputs) is on cuda:0"));
  s = l.runner->forward_backward(alloc, {.inputs = l.batch.inputs, .targets = targets_on_gpu}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("the targets (ctx.batch.targets) is on cuda:0"));
}

TEST(Mlp, BadWidthsAreRefused) {
  EXPECT_THAT(std::string(Mlp::create({16}).status().message()), HasSubstr("at least two widths"));
  EXPECT_THAT(std::string(Mlp::create({16, 0, 10}).status().message()), HasSubstr("MLP width 1 is 0"));
}

}  // namespace
}  // namespace zero
