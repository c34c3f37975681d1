// bf16/fp16 model paths (issue 4): a unit widens its half parameters and gradients to fp32, computes in
// fp32, and rounds each gradient once (models/unit_common.h, Fp32Views). Pinned two ways: bit for bit
// against an fp32 run on the same (exactly representable) weights, and against the PyTorch fixtures
// within a tolerance derived from the format's unit roundoff.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
#include "tests/models/model_runner.h"

namespace zero {
namespace {

using testing::max_relative_error;
using testing::ModelRunner;
using testing::RunResult;

const std::string kMlp = ZERO_FIXTURES_DIR "/mlp.safetensors";
const std::vector<int64_t> kMlpWidths = {16, 32, 32, 10};

// Unit roundoff: round to nearest moves x by at most half an ulp, and for p significand bits (the
// implicit one included) that is |round(x) - x| <= u|x| with u = 2^-p, the worst case at x just above a
// power of two. bf16 has p = 8 (7 stored): u = 2^-8; fp16 p = 11: u = 2^-11. (Issue 4 says 2^-9 for
// bf16's 8-bit mantissa; that is half of u, the bound for p = 9, and x = 1 + 2^-8 rounds to 1 with
// relative error 2^-8 / (1 + 2^-8) > 2^-9.)
double unit_roundoff(DType t) { return t == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

uint16_t to_half(DType t, float v) { return t == DType::kBF16 ? float_to_bf16(v) : float_to_fp16(v); }
float from_half(DType t, uint16_t h) { return t == DType::kBF16 ? bf16_to_float(h) : fp16_to_float(h); }
float round_to(DType t, float v) { return from_half(t, to_half(t, v)); }

// A tensor's elements as fp32 (exact from any floating dtype).
std::vector<float> values(const Tensor& t) {
  std::vector<float> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = load_as_float(t.data(), t.dtype(), i);
  return out;
}

// The bits of a half tensor.
std::vector<uint16_t> half_bits(const Tensor& t) {
  const uint16_t* p = static_cast<const uint16_t*>(t.data());
  return std::vector<uint16_t>(p, p + t.numel());
}

// Every gradient, rounded in place to `t`: what a half engine's gradient storage does to the fp32
// values a unit's backward leaves there.
void round_grads_in_place(ModelRunner& runner, DType t) {
  runner.for_each_param([&](const std::string& unit, const std::string& param) {
    const Tensor g = runner.grad(unit, param);
    for (int64_t i = 0; i < g.numel(); ++i) g.data_as<float>()[i] = round_to(t, g.data_as<float>()[i]);
  });
}

// ---- GPT-2 ----

Gpt2Config tiny() { return *Gpt2Config::preset("tiny"); }

struct Gpt2Run {
  std::unique_ptr<Gpt2> model;
  std::unique_ptr<ModelRunner> runner;
};

// A tiny GPT-2 holding `dtype` views, loaded with the fixture's weights; with `pre_round`, each weight is
// first rounded to that format (so it is exactly representable in bf16/fp16 and the fp32 run of the
// same weights sees the very values the half run widens).
Gpt2Run load_gpt2(DType dtype, DType pre_round = DType::kF32) {
  Gpt2Run r{.model = *Gpt2::create(tiny())};
  r.runner = std::make_unique<ModelRunner>(*r.model, dtype);
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(testing::kGpt2TinyWeights, tiny());
  EXPECT_TRUE(reader.ok()) << reader.status();
  const absl::Status s = r.runner->load([&](absl::string_view unit, absl::string_view param, const Tensor& dst) {
    ZERO_RETURN_IF_ERROR(reader->fill(unit, param, dst));
    if (pre_round != DType::kF32) {
      for (int64_t i = 0; i < dst.numel(); ++i) dst.data_as<float>()[i] = round_to(pre_round, dst.data_as<float>()[i]);
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return r;
}

// The one tied parameter: wte, owned by the embedding, also read (and its gradient added to) by the head.
bool is_tied_wte(const std::string& unit, const std::string& param) {
  return unit == kGpt2EmbeddingUnit && param == "wte.weight";
}

struct Precision {
  DType dtype;
  // A power of two, so the scaled gradients are the unscaled ones times it exactly (gpt2_test.cc's
  // LossScaleMultipliesEveryGradientExactly) and dividing it back out of a half gradient is exact too.
  // fp16's largest finite value is 65504 and the tiny GPT-2's largest |gradient| is ~0.5 (asserted
  // below): 1024 keeps every scaled gradient below ~512, far from overflow, and lifts the small ones
  // out of fp16's subnormals (< 2^-14).
  float loss_scale;
};

class Gpt2Precision : public ::testing::TestWithParam<Precision> {};

TEST_P(Gpt2Precision, GradientsAreTheFp32RunsRoundedOnceAndTheLossIsEqual) {
  const auto [half, scale] = GetParam();
  testing::Gpt2FixtureBatch f = testing::load_gpt2_fixture_batch();
  Gpt2Run h = load_gpt2(half, half), fp32 = load_gpt2(DType::kF32, half);
  // The tied wte gradient is stored by two units in turn, the head's backward and then the
  // embedding's: under a half engine each rounds its sum once, so wte is rounded twice, the head's
  // part on its own first. `emulated` is an fp32 run whose gradient storage rounds to the half format
  // after every unit, as a half engine's does: the bits to expect for wte. (Every other gradient is
  // written by one unit only, where rounding after that unit or at the end is the same.)
  Gpt2Run emulated = load_gpt2(DType::kF32, half);
  emulated.runner->set_after_backward([&](const std::string&) { round_grads_in_place(*emulated.runner, half); });
  Allocator alloc;
  absl::StatusOr<RunResult> rh = h.runner->forward_backward(alloc, f.batch, scale);
  absl::StatusOr<RunResult> r32 = fp32.runner->forward_backward(alloc, f.batch, scale);
  absl::StatusOr<RunResult> re = emulated.runner->forward_backward(alloc, f.batch, scale);
  ASSERT_TRUE(rh.ok() && r32.ok() && re.ok()) << rh.status() << r32.status() << re.status();

  // Forward widens exactly the values the fp32 run holds, so the same fp32 kernels give the same bits.
  EXPECT_EQ(std::memcmp(&rh->loss, &r32->loss, sizeof(float)), 0) << rh->loss << " vs " << r32->loss;
  EXPECT_EQ(rh->logits, r32->logits);

  int64_t compared = 0, wte_double_rounding_differs = 0;
  float max_abs_scaled = 0;
  h.runner->for_each_param([&](const std::string& unit, const std::string& param) {
    const Tensor got = h.runner->grad(unit, param);
    ASSERT_EQ(got.dtype(), half);
    const std::vector<float> g32 = values(fp32.runner->grad(unit, param));
    std::vector<uint16_t> want(g32.size());
    for (size_t i = 0; i < g32.size(); ++i) {
      want[i] = to_half(half, g32[i]);
      max_abs_scaled = std::max(max_abs_scaled, std::fabs(g32[i]));
    }
    const std::vector<uint16_t> bits = half_bits(got);
    if (is_tied_wte(unit, param)) {
      const std::vector<float> ge = values(emulated.runner->grad(unit, param));
      for (size_t i = 0; i < ge.size(); ++i) {
        ASSERT_EQ(bits[i], to_half(half, ge[i])) << unit << "." << param << "[" << i << "] " << dtype_name(half);
        wte_double_rounding_differs += bits[i] != want[i];
      }
    } else {
      for (size_t i = 0; i < bits.size(); ++i) {
        ASSERT_EQ(bits[i], want[i]) << unit << "." << param << "[" << i << "] " << dtype_name(half) << ": got "
                                    << from_half(half, bits[i]) << ", fp32 " << g32[i];
      }
    }
    for (uint16_t b : bits) ASSERT_TRUE(std::isfinite(from_half(half, b))) << unit << "." << param;
    compared += static_cast<int64_t>(bits.size());
  });
  EXPECT_EQ(compared, static_cast<int64_t>(fp32.runner->all_grads().size()));
  EXPECT_LT(max_abs_scaled / scale, 1.0f) << "the loss-scale comment's premise";
  std::printf(
      "[ %s ] %lld gradient elements compared; max |scaled grad| %g; wte elements where the head's "
      "separate rounding changed the result: %lld of %lld\n",
      std::string(dtype_name(half)).c_str(), static_cast<long long>(compared), max_abs_scaled,
      static_cast<long long>(wte_double_rounding_differs),
      static_cast<long long>(h.runner->grad(kGpt2EmbeddingUnit, "wte.weight").numel()));
}

// Tolerance against PyTorch. The fixture is float64 math on the fp32 weights w; the half run computes
// in fp32 (errors ~1e-6 of a tensor's scale, gpt2_test.cc's kTolerance = 1e-5 covers them) from the
// weights rounded once, w(1 + e) with |e| <= u, and rounds each gradient once more.
//  - The last rounding moves each gradient element by at most u|g| <= u max|g|: u of the tensor's scale.
//  - Weight rounding: to first order a gradient moves by sum_k (d g / d w_k) w_k e_k over the model's
//    weight tensors k. Within one tensor, a worst-case sign pattern would make the e_k add up like the
//    |terms| (a factor ~sqrt(n) over the signal, n up to 128 here), but round-to-nearest errors of
//    unrelated values are independent, zero mean and about uniform on [-u, u] (rms u/sqrt(3)), so they add
//    like the signal's own terms do: tensor k perturbs a gradient by ~u/sqrt(3) of its scale, rms. A
//    weight reaches a gradient both through the forward activations and through the backward's dy: twice
//    that, 2u/sqrt(3). The K tensors' perturbations are independent, so they add in quadrature: rms
//    2u sqrt(K/3). Over a tensor of a few thousand elements a Gaussian's largest is below 4.5 rms (the
//    chance of one element beyond is ~7e-6), and max|g| is at least the rms scale: 9u sqrt(K/3).
// Bound: u (1 + 9 sqrt(K/3)) + kFp32Tolerance. The loss and logits see the forward path only: 4.5u sqrt(K/3).
constexpr double kFp32Tolerance = 1e-5;
double gradient_bound(DType t, int tensors) {
  return unit_roundoff(t) * (1 + 9 * std::sqrt(tensors / 3.0)) + kFp32Tolerance;
}
double forward_bound(DType t, int tensors) {
  return unit_roundoff(t) * 4.5 * std::sqrt(tensors / 3.0) + kFp32Tolerance;
}

TEST_P(Gpt2Precision, GradientsMatchPyTorchWithinTheFormatsBound) {
  const auto [half, scale] = GetParam();
  constexpr int kTensors = 2 + 2 * 12 + 2;  // wte, wpe; 12 per block; ln_f
  const double bound = gradient_bound(half, kTensors);
  testing::Gpt2FixtureBatch f = testing::load_gpt2_fixture_batch();
  Gpt2Run h = load_gpt2(half);  // the fixture's fp32 weights, rounded once by load()
  Allocator alloc;
  absl::StatusOr<RunResult> r = h.runner->forward_backward(alloc, f.batch, scale);
  ASSERT_TRUE(r.ok()) << r.status();

  const Gpt2Config c = tiny();
  std::vector<float> logits, want_logits = values(*f.io.get("logits"));
  for (int64_t row = 0; row < 2 * 8; ++row) {
    const float* begin = r->logits.data() + row * c.padded_vocab_size;
    logits.insert(logits.end(), begin, begin + c.vocab_size);
  }
  const double logits_err = max_relative_error(logits, want_logits);
  EXPECT_LT(logits_err, forward_bound(half, kTensors));
  // Cross-entropy's gradient in the logits, p - onehot, has |.|_1 <= 2 per row: the mean loss moves by
  // at most twice the largest logit change.
  double max_logit = 0;
  for (float z : want_logits) max_logit = std::max(max_logit, std::fabs(static_cast<double>(z)));
  const float want_loss = *f.io.get("loss")->data_as<float>();
  EXPECT_LE(std::fabs(r->loss - want_loss), 2 * forward_bound(half, kTensors) * max_logit);

  absl::StatusOr<Gpt2HfReader> grads = Gpt2HfReader::open(testing::kGpt2TinyGrads, tiny());
  ASSERT_TRUE(grads.ok()) << grads.status();
  double worst = 0;
  std::string worst_name;
  int checked = 0;
  h.runner->for_each_param([&](const std::string& unit, const std::string& param) {
    const Tensor got = h.runner->grad(unit, param);
    std::vector<float> want(got.numel());
    ASSERT_TRUE(grads->fill(unit, param, Tensor(want.data(), DType::kF32, got.shape())).ok());
    std::vector<float> unscaled = values(got);
    for (float& g : unscaled) g /= scale;  // a power of two: exact
    const double err = max_relative_error(unscaled, want);
    EXPECT_LT(err, bound) << unit << "." << param;
    if (err > worst) worst = err, worst_name = unit + "." + param;
    ++checked;
  });
  EXPECT_EQ(checked, kTensors);
  std::printf(
      "[ %s ] vs PyTorch: worst gradient %s %.3g (%.2f u), bound %.3g (%.2f u); logits %.3g, bound %.3g; "
      "loss %.7g vs %.7g\n",
      std::string(dtype_name(half)).c_str(), worst_name.c_str(), worst, worst / unit_roundoff(half), bound,
      bound / unit_roundoff(half), logits_err, forward_bound(half, kTensors), r->loss, want_loss);
}

INSTANTIATE_TEST_SUITE_P(HalfFormats, Gpt2Precision,
                         ::testing::Values(Precision{DType::kBF16, 1.0f}, Precision{DType::kF16, 1024.0f}),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                           return std::string(dtype_name(info.param.dtype));
                         });

// ---- MLP ----

struct MlpRun {
  SafetensorsFile file;
  std::unique_ptr<Mlp> model;
  std::unique_ptr<ModelRunner> runner;
  Batch batch;  // inputs (8, 16) fp32, targets (8)
};

MlpRun load_mlp(DType dtype, DType pre_round = DType::kF32) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(kMlp);
  EXPECT_TRUE(file.ok()) << file.status();
  MlpRun r{.file = *std::move(file), .model = *Mlp::create(kMlpWidths)};
  r.runner = std::make_unique<ModelRunner>(*r.model, dtype);
  const absl::Status s = r.runner->load([&](absl::string_view unit, absl::string_view param, const Tensor& dst) {
    ZERO_ASSIGN_OR_RETURN(Tensor src, r.file.get(absl::StrCat(unit, ".", param), DType::kF32, dst.shape()));
    for (int64_t i = 0; i < dst.numel(); ++i) {
      const float w = src.data_as<float>()[i];
      dst.data_as<float>()[i] = pre_round == DType::kF32 ? w : round_to(pre_round, w);
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  r.batch = {.inputs = *r.file.get("inputs"), .targets = *r.file.get("targets")};
  return r;
}

class MlpPrecision : public ::testing::TestWithParam<Precision> {};

TEST_P(MlpPrecision, GradientsAreTheFp32RunsRoundedOnceAndTheLossIsEqual) {
  const auto [half, scale] = GetParam();
  MlpRun h = load_mlp(half, half), fp32 = load_mlp(DType::kF32, half);
  Allocator alloc;
  absl::StatusOr<RunResult> rh = h.runner->forward_backward(alloc, h.batch, scale);
  absl::StatusOr<RunResult> r32 = fp32.runner->forward_backward(alloc, fp32.batch, scale);
  ASSERT_TRUE(rh.ok() && r32.ok()) << rh.status() << r32.status();
  EXPECT_EQ(std::memcmp(&rh->loss, &r32->loss, sizeof(float)), 0) << rh->loss << " vs " << r32->loss;
  EXPECT_EQ(rh->logits, r32->logits);
  int64_t compared = 0;
  h.runner->for_each_param([&](const std::string& unit, const std::string& param) {
    const std::vector<uint16_t> bits = half_bits(h.runner->grad(unit, param));
    const std::vector<float> g32 = values(fp32.runner->grad(unit, param));
    for (size_t i = 0; i < bits.size(); ++i) {
      ASSERT_EQ(bits[i], to_half(half, g32[i])) << unit << "." << param << "[" << i << "] " << dtype_name(half)
                                                << ": got " << from_half(half, bits[i]) << ", fp32 " << g32[i];
      ASSERT_TRUE(std::isfinite(from_half(half, bits[i])));
    }
    compared += static_cast<int64_t>(bits.size());
  });
  EXPECT_EQ(compared, 16 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10);
}

TEST_P(MlpPrecision, GradientsMatchPyTorchWithinTheFormatsBound) {
  const auto [half, scale] = GetParam();
  constexpr int kTensors = 6;  // fc0..fc2, weight and bias
  const double bound = gradient_bound(half, kTensors);
  MlpRun h = load_mlp(half);
  Allocator alloc;
  absl::StatusOr<RunResult> r = h.runner->forward_backward(alloc, h.batch, scale);
  ASSERT_TRUE(r.ok()) << r.status();
  const double logits_err = max_relative_error(r->logits, values(*h.file.get("logits")));
  EXPECT_LT(logits_err, forward_bound(half, kTensors));
  double worst = 0;
  std::string worst_name;
  h.runner->for_each_param([&](const std::string& unit, const std::string& param) {
    const Tensor got = h.runner->grad(unit, param);
    absl::StatusOr<Tensor> want = h.file.get(absl::StrCat("grad.", unit, ".", param), DType::kF32, got.shape());
    ASSERT_TRUE(want.ok()) << want.status();
    std::vector<float> unscaled = values(got);
    for (float& g : unscaled) g /= scale;
    const double err = max_relative_error(unscaled, values(*want));
    EXPECT_LT(err, bound) << unit << "." << param;
    if (err > worst) worst = err, worst_name = unit + "." + param;
  });
  std::printf("[ %s ] MLP vs PyTorch: worst gradient %s %.3g (%.2f u), bound %.3g (%.2f u); logits %.3g, bound %.3g\n",
              std::string(dtype_name(half)).c_str(), worst_name.c_str(), worst, worst / unit_roundoff(half), bound,
              bound / unit_roundoff(half), logits_err, forward_bound(half, kTensors));
}

INSTANTIATE_TEST_SUITE_P(HalfFormats, MlpPrecision,
                         ::testing::Values(Precision{DType::kBF16, 1.0f}, Precision{DType::kF16, 1024.0f}),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                           return std::string(dtype_name(info.param.dtype));
                         });

}  // namespace
}  // namespace zero
