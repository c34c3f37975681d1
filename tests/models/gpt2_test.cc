// GPT-2 units: loss, logits and every gradient against PyTorch, recompute, loss scaling, activation bytes, input
// errors.
#include "models/gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "models/gpt2_weights.h"
#include "runtime/safetensors.h"
#include "tests/models/compare.h"
#include "tests/models/gpt2_fixture.h"
#include "tests/models/model_runner.h"

namespace zero {
namespace {

using testing::floats_of;
using ::testing::HasSubstr;
using testing::max_relative_error;
using testing::ModelRunner;
using testing::RunResult;

Gpt2Config tiny() { return *Gpt2Config::preset("tiny"); }

// A tiny GPT-2 with the fixture's weights.
struct Loaded {
  std::unique_ptr<Gpt2> model;
  std::unique_ptr<ModelRunner> runner;
};

Loaded load_model(DType dtype = DType::kF32) {
  Loaded l{.model = *Gpt2::create(tiny())};
  l.runner = std::make_unique<ModelRunner>(*l.model, dtype);
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(testing::kGpt2TinyWeights, tiny());
  EXPECT_TRUE(reader.ok()) << reader.status();
  const absl::Status s = l.runner->load([&](absl::string_view unit, absl::string_view param, const Tensor& dst) {
    return reader->fill(unit, param, dst);
  });
  EXPECT_TRUE(s.ok()) << s;
  return l;
}

// The fixture is float64 math on fp32 parameters rounded once; zero runs in fp32. A sum of n fp32 terms
// is typically off by ~sqrt(n)·2^-24 of the magnitudes summed (n <= 4C = 128 here), and about twenty
// such steps chain from the loss back to the first block: ~1e-6 of a tensor's scale (the largest seen is
// 6.5e-7). 1e-5 leaves a margin and still catches any wrong term (a missing residual, a transposed
// weight), which is an O(1) error.
constexpr double kTolerance = 1e-5;

TEST(Gpt2, LossAndLogitsMatchPyTorch) {
  testing::Gpt2FixtureBatch f = testing::load_gpt2_fixture_batch();
  Loaded l = load_model();
  Allocator alloc;
  absl::StatusOr<RunResult> r = l.runner->forward_backward(alloc, f.batch);
  ASSERT_TRUE(r.ok()) << r.status();
  const float want_loss = *f.io.get("loss")->data_as<float>();
  EXPECT_NEAR(r->loss, want_loss, kTolerance * want_loss);
  EXPECT_EQ(r->predictions, 2 * 8 - 2) << "two targets are kIgnoreIndex";

  const Gpt2Config c = tiny();
  ASSERT_EQ(r->logits_shape, Shape({2, 8, c.padded_vocab_size}));
  const Tensor want = *f.io.get("logits");  // (B, T, V): zero's rows are Vp wide
  std::vector<float> real;
  for (int64_t row = 0; row < 2 * 8; ++row) {
    const float* begin = r->logits.data() + row * c.padded_vocab_size;
    real.insert(real.end(), begin, begin + c.vocab_size);
  }
  EXPECT_LT(max_relative_error(real, floats_of(want)), kTolerance);
}

TEST(Gpt2, EveryGradientMatchesPyTorch) {
  testing::Gpt2FixtureBatch f = testing::load_gpt2_fixture_batch();
  Loaded l = load_model();
  Allocator alloc;
  ASSERT_TRUE(l.runner->forward_backward(alloc, f.batch).ok());
  // The gradients file has the weights file's names and layout, so the same reader maps it to zero's.
  absl::StatusOr<Gpt2HfReader> grads = Gpt2HfReader::open(testing::kGpt2TinyGrads, tiny());
  ASSERT_TRUE(grads.ok()) << grads.status();
  int checked = 0;
  l.runner->for_each_param([&](const std::string& unit, const std::string& param) {
    const Tensor got = l.runner->grad(unit, param);
    std::vector<float> want(got.numel());
    ASSERT_TRUE(grads->fill(unit, param, Tensor(want.data(), DType::kF32, got.shape())).ok());
    EXPECT_LT(max_relative_error(floats_of(got), want), kTolerance) << unit << " " << param;
    ++checked;
  });
  EXPECT_EQ(checked, 2 + 2 * 12 + 2) << "wte, wpe; 12 per block; ln_f";
  // wte's padding rows (V..Vp) are no token's and no prediction's: exactly zero gradient.
  const Gpt2Config c = tiny();
  const Tensor dwte = l.runner->grad(kGpt2EmbeddingUnit, "wte.weight");
  for (int64_t i = c.vocab_size * c.channels; i < dwte.numel(); ++i) ASSERT_EQ(dwte.data_as<float>()[i], 0.0f) << i;
}

TEST(Gpt2, GradientsAddAcrossCalls) {
  // The contract: backward adds. Two identical micro-batches give twice one; kernels that add row by
  // row into the gradient sum in another order the second time (S + s1 + s2 ... rather than S + S), so
  // equality is to fp32 rounding of those sums, far below the 0.5 an overwrite would leave.
  testing::Gpt2FixtureBatch f = testing::load_gpt2_fixture_batch();
  Loaded once = load_model(), twice = load_model();
  Allocator alloc;
  ASSERT_TRUE(once.runner->forward_backward(alloc, f.batch).ok());
  ASSERT_TRUE(twice.runner->forward_backward(alloc, f.batch).ok());
  ASSERT_TRUE(twice.runner->forward_backward(alloc, f.batch).ok());
  std::vector<float> doubled = once.runner->all_grads();
  for (float& g : doubled) g *= 2;
  const std::vector<float> got = twice.runner->all_grads();
  EXPECT_LT(max_relative_error(got, doubled), kTolerance);
}

TEST(Gpt2, RecomputeGivesBitIdenticalGradients) {
  testing::Gpt2FixtureBatch f = testing::load_gpt2_fixture_batch();
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    Loaded saved = load_model(dtype), recomputed = load_model(dtype);
    for (int64_t layer = 0; layer < tiny().num_layers; ++layer) recomputed.model->set_recompute(layer, true);
    Allocator alloc;
    absl::StatusOr<RunResult> a = saved.runner->forward_backward(alloc, f.batch);
    absl::StatusOr<RunResult> b = recomputed.runner->forward_backward(alloc, f.batch);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(std::memcmp(&a->loss, &b->loss, sizeof(float)), 0) << dtype_name(dtype);
    const std::vector<float> ga = saved.runner->all_grads(), gb = recomputed.runner->all_grads();
    ASSERT_EQ(ga.size(), gb.size());
    EXPECT_EQ(std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)), 0) << dtype_name(dtype);
  }
}

TEST(Gpt2, LossScaleMultipliesEveryGradientExactly) {
  // Backward is linear in d(loss)/d(logits); scaling it by a power of two scales every rounded
  // product and sum by the same power, so (away from overflow and subnormals) the bits are exact.
  testing::Gpt2FixtureBatch f = testing::load_gpt2_fixture_batch();
  Loaded plain = load_model(), scaled = load_model();
  Allocator alloc;
  absl::StatusOr<RunResult> a = plain.runner->forward_backward(alloc, f.batch);
  absl::StatusOr<RunResult> b = scaled.runner->forward_backward(alloc, f.batch, 1024.0f);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->loss, b->loss) << "the scale multiplies the gradient, not the reported loss";
  std::vector<float> want = plain.runner->all_grads();
  for (float& g : want) g *= 1024.0f;
  EXPECT_EQ(scaled.runner->all_grads(), want);
}

// A batch of B random-looking rows of T tokens, targets the next token.
struct TokenBatch {
  std::vector<int32_t> tokens, targets;
  Batch batch;
  TokenBatch(const Gpt2Config& c, int64_t B, int64_t T) {
    for (int64_t i = 0; i < B * T; ++i) {
      tokens.push_back(static_cast<int32_t>((i * 37 + 11) % c.vocab_size));
      targets.push_back(static_cast<int32_t>((i * 37 + 48) % c.vocab_size));
    }
    batch = {.inputs = Tensor(tokens.data(), DType::kI32, {B, T}),
             .targets = Tensor(targets.data(), DType::kI32, {B, T})};
  }
};

TEST(Gpt2, PeakActivationBytesMatchTheDocumentedFormula) {
  const Gpt2Config c = tiny();
  // B·T a multiple of 16 (64 bytes of fp32 statistics), so no tensor pads; B·NH·T too; C and Vp even.
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [B, T] : {std::pair<int64_t, int64_t>{2, 8}, {3, 16}}) {
      for (bool recompute : {false, true}) {
        std::unique_ptr<Gpt2> model = *Gpt2::create(c);
        for (int64_t layer = 0; layer < c.num_layers; ++layer) model->set_recompute(layer, recompute);
        ModelRunner runner(*model, dtype);
        runner.set_reads_logits(false);  // as the engine trains
        TokenBatch data(c, B, T);
        Allocator alloc;
        ASSERT_TRUE(runner.forward_backward(alloc, data.batch).ok());
        const MemoryStats m = alloc.stats();
        EXPECT_EQ(m.peak_of(MemoryCategory::kActivations), gpt2_peak_activation_bytes(c, B, T, recompute, dtype))
            << dtype_name(dtype) << " B=" << B << " T=" << T << " recompute=" << recompute;
        EXPECT_EQ(m.current_of(MemoryCategory::kActivations), 0) << "backward frees what forward saved";
        EXPECT_EQ(m.current_of(MemoryCategory::kWorkspace), 0) << "the last input gradient is freed too";
      }
    }
  }
}

TEST(Gpt2, TheLossGradientOverTheLogitsSavesTheirBufferAndChangesNoBit) {
  // Unread logits take the loss's gradient in place (llm.c's fused classifier): one B·T·Vp buffer less at the
  // peak, and the same loss and gradients as a run that keeps the logits to read them.
  const Gpt2Config c = tiny();
  constexpr int64_t B = 2, T = 8;
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<float> grads[2];
    float loss[2];
    int64_t peak[2];
    for (const bool reads : {false, true}) {
      std::unique_ptr<Gpt2> model = *Gpt2::create(c);
      ModelRunner runner(*model, dtype);
      runner.init(7);
      runner.set_reads_logits(reads);
      TokenBatch data(c, B, T);
      Allocator alloc;
      const absl::StatusOr<RunResult> r = runner.forward_backward(alloc, data.batch);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->logits.size(), reads ? static_cast<size_t>(B * T * c.padded_vocab_size) : 0u);
      grads[reads] = runner.all_grads();
      loss[reads] = r->loss;
      peak[reads] = alloc.stats().peak_of(MemoryCategory::kActivations);
    }
    EXPECT_EQ(peak[1] - peak[0], B * T * c.padded_vocab_size * dtype_size(dtype)) << dtype_name(dtype);
    EXPECT_EQ(loss[0], loss[1]) << dtype_name(dtype);
    EXPECT_EQ(grads[0], grads[1]) << dtype_name(dtype);
  }
}

absl::Status run_tokens(std::vector<int32_t> tokens, int64_t B, int64_t T) {
  const Gpt2Config c = tiny();
  std::unique_ptr<Gpt2> model = *Gpt2::create(c);
  ModelRunner runner(*model);
  std::vector<int32_t> targets(tokens.size(), 0);
  const Batch batch{.inputs = Tensor(tokens.data(), DType::kI32, {B, T}),
                    .targets = Tensor(targets.data(), DType::kI32, {B, T})};
  Allocator alloc;
  return runner.forward_backward(alloc, batch).status();
}

TEST(Gpt2, TokenOutsideTheVocabularyIsAnError) {
  // V = 100 < Vp = 128: token 100 has a (padding) row in wte but is no token.
  std::vector<int32_t> tokens(2 * 4, 5);
  tokens[6] = 100;
  const absl::Status s = run_tokens(tokens, 2, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("token 100 at (1, 2) is outside the vocabulary [0, 100)"));
  tokens[6] = -3;
  EXPECT_THAT(std::string(run_tokens(tokens, 2, 4).message()), HasSubstr("token -3 at (1, 2)"));
}

TEST(Gpt2, SequenceLongerThanMaxSeqLenIsAnError) {
  const absl::Status s = run_tokens(std::vector<int32_t>(17, 1), 1, 17);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("T = 17 exceeds max_seq_len 16"));
}

TEST(Gpt2, NonTokenInputsAreAnError) {
  std::unique_ptr<Gpt2> model = *Gpt2::create(tiny());
  ModelRunner runner(*model);
  std::vector<float> features(8);
  std::vector<int32_t> targets(8);
  const Batch batch{.inputs = Tensor(features.data(), DType::kF32, {2, 4}),
                    .targets = Tensor(targets.data(), DType::kI32, {2, 4})};
  Allocator alloc;
  const absl::Status s = runner.forward_backward(alloc, batch).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("GPT-2 takes int32 tokens of shape (B, T)"));
}

TEST(Gpt2, TokensOnAnotherDeviceThanTheUnitsAreAnError) {
  std::unique_ptr<Gpt2> model = *Gpt2::create(tiny());
  ModelRunner runner(*model);  // runs on the CPU
  std::vector<int32_t> tokens(8, 1), targets(8, 1);
  // Host memory labelled cuda:0: refused before anything reads it.
  const Batch batch{.inputs = Tensor(tokens.data(), DType::kI32, {2, 4}, Device::cuda(0)),
                    .targets = Tensor(targets.data(), DType::kI32, {2, 4})};
  Allocator alloc;
  const absl::Status s = runner.forward_backward(alloc, batch).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("GPT-2's tokens (ctx.batch.inputs) is on cuda:0 but the unit runs on cpu"));
}

TEST(Gpt2, TargetOutsideTheVocabularyIsAnError) {
  Allocator alloc;  // outlives the model: a failed forward leaves earlier units' activations held
  std::unique_ptr<Gpt2> model = *Gpt2::create(tiny());
  ModelRunner runner(*model);
  std::vector<int32_t> tokens(8, 1), targets(8, 1);
  targets[3] = 120;  // a padding column of the logits
  const Batch batch{.inputs = Tensor(tokens.data(), DType::kI32, {2, 4}),
                    .targets = Tensor(targets.data(), DType::kI32, {2, 4})};
  const absl::Status s = runner.forward_backward(alloc, batch).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("target 120 at 3 outside [0, 100)"));
}

TEST(Gpt2, InvalidConfigIsRefused) {
  Gpt2Config c = tiny();
  c.num_heads = 3;  // 32 channels do not split into 3 heads
  EXPECT_EQ(Gpt2::create(c).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zero
