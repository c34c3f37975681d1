#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "kernel_test_util.h"
#include "kernels/kernels.h"
#include "kernels/max_at.h"
#include "runtime/cpu_threads.h"
#include "runtime/status.h"

namespace zero::kernels {
namespace {

using testing::kU32;
using testing::random_floats;
using testing::view;

// Logits the argmax must agree on: NaNs, infinities, signed zeros, -FLT_MAX and ties.
constexpr float kLogitPool[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -FLT_MAX, -INFINITY, INFINITY, NAN, 0.5f};

// The CUDA cross-entropy's argmax folds a chunk at a time: max_at_chunk must make max_at's choices element by
// element, from the scan's start (-FLT_MAX at an index past the row), over rows of NaNs, infinities, signed zeros,
// -FLT_MAX and ties, and chunks cut short at a row's end. The state after every chunk is compared, value bits
// included.
TEST(MaxAtChunk, ChoosesAsMaxAtElementByElement) {
  const float(&pool)[10] = kLogitPool;
  std::mt19937 rng(7);
  const auto same = [](MaxAt a, MaxAt b) {
    return a.index == b.index &&
           (std::memcmp(&a.value, &b.value, sizeof(float)) == 0 || (std::isnan(a.value) && std::isnan(b.value)));
  };
  for (int row = 0; row < 20000; ++row) {
    const int64_t vocab = 1000;
    MaxAt one_by_one{-FLT_MAX, vocab}, by_chunk{-FLT_MAX, vocab};
    const int chunks = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < chunks; ++k) {
      float x[8] = {};
      const int count = k == chunks - 1 ? 1 + static_cast<int>(rng() % 8) : 8;
      for (int e = 0; e < count; ++e) x[e] = pool[rng() % std::size(pool)];
      const int64_t v = 8 * k;
      for (int e = 0; e < count; ++e) one_by_one = max_at(one_by_one, MaxAt{x[e], v + e});
      by_chunk = max_at_chunk(by_chunk, x, v, count);
      ASSERT_TRUE(same(by_chunk, one_by_one))
          << "row " << row << ", chunk " << k << ": " << by_chunk.value << " at " << by_chunk.index << ", not "
          << one_by_one.value << " at " << one_by_one.index;
    }
  }
}

// The CUDA cross-entropy's argmax is the CPU kernel's, which counts the row correct with that column as its target.
// The GPU's thread t scans its chunks of 8 (kChunk) at t, t + kThreads, ... from {-FLT_MAX, vocab} with
// max_at_chunk, a fixed tree of max_at (element i with i + half) combines the threads, and argmax_as_cpu ends it; here
// the rows are at most 200 long, so each chunk is a thread's alone, and 32 leaves of the tree stand for its 256 (the
// rest hold the start, which never wins). Rows of 1 to 200 logits from the pool, a quarter of -inf and NaN alone.
TEST(MaxAtChunk, ThreadsTreeAndArgmaxAsCpuGiveTheCpusArgmax) {
  const float extremes[] = {-INFINITY, NAN};
  std::mt19937 rng(11);
  for (int row = 0; row < 4000; ++row) {
    const int64_t vocab = 1 + static_cast<int64_t>(rng() % (row % 2 == 0 ? 20 : 200));
    const bool only_extremes = rng() % 4 == 0;
    std::vector<float> x(vocab);
    for (float& v : x) v = only_extremes ? extremes[rng() % 2] : kLogitPool[rng() % std::size(kLogitPool)];
    std::vector<MaxAt> threads(32, MaxAt{-FLT_MAX, vocab});
    for (int64_t v = 0; v < vocab; v += 8) {
      float chunk[8] = {};
      const int64_t count = std::min<int64_t>(8, vocab - v);
      std::copy_n(x.begin() + v, count, chunk);
      threads[v / 8] = max_at_chunk(threads[v / 8], chunk, v, count);
    }
    for (size_t half = threads.size() / 2; half > 0; half /= 2) {
      for (size_t t = 0; t < half; ++t) threads[t] = max_at(threads[t], threads[t + half]);
    }
    std::vector<int32_t> target = {static_cast<int32_t>(argmax_as_cpu(threads[0], x[0], vocab))};
    std::vector<float> dlogits(vocab);
    absl::StatusOr<CrossEntropyResult> r =
        crossentropy_forward_backward(view(dlogits, {1, vocab}), view(x, {1, vocab}), view(target, {1}), vocab);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->correct, 1) << "row " << row << " of " << vocab << ": the scan chose column " << target[0]
                             << ", x[0] = " << x[0];
  }
}

constexpr int64_t kN = 6, kV = 7, kVp = 9;

// Mean over non-ignored rows of logsumexp(x[0, V)) - x[target], in fp64.
double reference_loss(const std::vector<double>& x, const std::vector<int32_t>& targets) {
  double total = 0;
  int counted = 0;
  for (int64_t r = 0; r < kN; ++r) {
    if (targets[r] == kIgnoreIndex) continue;
    double m = -INFINITY, s = 0;
    for (int64_t v = 0; v < kV; ++v) m = std::max(m, x[r * kVp + v]);
    for (int64_t v = 0; v < kV; ++v) s += std::exp(x[r * kVp + v] - m);
    total += m + std::log(s) - x[r * kVp + targets[r]];
    ++counted;
  }
  return total / counted;
}

// Logits in [-3, 3]: softmax terms in fp32 (expf within 2 ulp, one product each) and a log of a fp64 sum;
// gradients and the loss are O(1), so 32 u absolute bounds their errors with margin.
constexpr double kTol = 32 * kU32;

TEST(CrossEntropy, LossAndGradientMatchReferenceWithPaddingAndIgnoredTargets) {
  std::vector<float> logits = random_floats(kN * kVp, 1, -3.0f, 3.0f), dlogits(kN * kVp, 7.0f);
  std::vector<int32_t> targets = {2, kIgnoreIndex, 6, 0, kIgnoreIndex, 3};
  absl::StatusOr<CrossEntropyResult> r =
      crossentropy_forward_backward(view(dlogits, {2, 3, kVp}), view(logits, {2, 3, kVp}), view(targets, {2, 3}), kV);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->counted, 4);
  const std::vector<double> x = testing::to_double(logits);
  EXPECT_NEAR(r->loss, reference_loss(x, targets), kTol);
  // Padded columns and ignored rows get exactly zero gradient; the rest matches d(mean loss)/d(logits).
  std::vector<double> expected = testing::numeric_grad(x, [&](const auto& v) { return reference_loss(v, targets); });
  testing::expect_near_all(dlogits, expected, kTol, "dlogits");
  for (int64_t r2 = 0; r2 < kN; ++r2) {
    for (int64_t v = 0; v < kVp; ++v) {
      if (v >= kV || targets[r2] == kIgnoreIndex) {
        EXPECT_EQ(dlogits[r2 * kVp + v], 0.0f) << r2 << "," << v;
      }
    }
  }
}

TEST(CrossEntropy, PaddedColumnsDoNotChangeLossOrArgmax) {
  std::vector<float> logits = random_floats(kN * kVp, 2, -3.0f, 3.0f), d(kN * kVp);
  std::vector<int32_t> targets = {0, 1, 2, 3, 4, 5};
  const CrossEntropyResult plain =
      *crossentropy_forward_backward(view(d, {kN, kVp}), view(logits, {kN, kVp}), view(targets, {kN}), kV);
  for (int64_t r = 0; r < kN; ++r) logits[r * kVp + kV] = logits[r * kVp + kV + 1] = 1e30f;
  const CrossEntropyResult padded =
      *crossentropy_forward_backward(view(d, {kN, kVp}), view(logits, {kN, kVp}), view(targets, {kN}), kV);
  EXPECT_EQ(plain.loss, padded.loss);
  EXPECT_EQ(plain.correct, padded.correct);
}

TEST(CrossEntropy, CountsArgmaxHitsOnCountedTargetsOnly) {
  std::vector<float> logits(3 * kVp, 0.0f), d(3 * kVp);
  logits[0 * kVp + 4] = 5.0f;  // row 0: argmax 4, target 4: correct
  logits[1 * kVp + 2] = 5.0f;  // row 1: argmax 2, target 1: wrong
  logits[2 * kVp + 6] = 5.0f;  // row 2: argmax 6 but ignored
  std::vector<int32_t> targets = {4, 1, kIgnoreIndex};
  const CrossEntropyResult r =
      *crossentropy_forward_backward(view(d, {3, kVp}), view(logits, {3, kVp}), view(targets, {3}), kV);
  EXPECT_EQ(r.counted, 2);
  EXPECT_EQ(r.correct, 1);
}

// A row longer than the vectorized max (8 lanes) and argmax search (64 columns): ties go to the lowest column.
TEST(CrossEntropy, ArgmaxIsTheFirstOfTiedMaximaInALongRow) {
  constexpr int64_t kLongV = 300, kLongVp = 304;
  std::vector<float> logits = random_floats(3 * kLongVp, 6), d(3 * kLongVp);
  for (int64_t r = 0; r < 2; ++r) logits[r * kLongVp + 130] = logits[r * kLongVp + 250] = 4.0f;
  std::fill(logits.begin() + 2 * kLongVp, logits.end(), 0.5f);  // row 2: every column ties
  std::vector<int32_t> targets = {130, 250, 0};
  const CrossEntropyResult r =
      *crossentropy_forward_backward(view(d, {3, kLongVp}), view(logits, {3, kLongVp}), view(targets, {3}), kLongV);
  EXPECT_EQ(r.correct, 2);  // rows 0 and 2
}

TEST(CrossEntropy, GivesTheSameBitsUnderAnyThreadCount) {
  constexpr int64_t kRows = 40, kLongV = 300;
  const std::vector<float> logits = random_floats(kRows * kLongV, 7, -3.0f, 3.0f);
  std::vector<int32_t> targets(kRows);
  for (int64_t r = 0; r < kRows; ++r) targets[r] = static_cast<int32_t>(r * 7 % kLongV);
  auto run = [&](int threads) {
    set_cpu_threads(threads);
    std::vector<float> d(kRows * kLongV);
    std::vector<float> x = logits;
    const CrossEntropyResult r = *crossentropy_forward_backward(view(d, {kRows, kLongV}), view(x, {kRows, kLongV}),
                                                                view(targets, {kRows}), kLongV);
    set_cpu_threads(1);
    d.push_back(r.loss);
    return d;
  };
  EXPECT_EQ(run(1), run(3));
}

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndGradient) {
  std::vector<float> logits = random_floats(2 * kVp, 3), d(2 * kVp, 5.0f);
  std::vector<int32_t> targets = {kIgnoreIndex, kIgnoreIndex};
  const CrossEntropyResult r =
      *crossentropy_forward_backward(view(d, {2, kVp}), view(logits, {2, kVp}), view(targets, {2}), kV);
  EXPECT_EQ(r.loss, 0.0f);
  EXPECT_EQ(r.counted, 0);
  EXPECT_EQ(d, std::vector<float>(2 * kVp, 0.0f));
}

TEST(CrossEntropy, GradientInPlaceOverLogitsMatchesSeparate) {
  std::vector<float> logits = random_floats(kN * kVp, 4, -3.0f, 3.0f), separate(kN * kVp);
  std::vector<int32_t> targets = {1, 2, kIgnoreIndex, 0, 6, 5};
  const CrossEntropyResult a =
      *crossentropy_forward_backward(view(separate, {kN, kVp}), view(logits, {kN, kVp}), view(targets, {kN}), kV);
  const CrossEntropyResult b =
      *crossentropy_forward_backward(view(logits, {kN, kVp}), view(logits, {kN, kVp}), view(targets, {kN}), kV);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(logits, separate);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  std::vector<float> logits = random_floats(kN * kVp, 5, -3.0f, 3.0f), d(kN * kVp);
  for (float& x : logits) x *= 1e4f;  // exp would overflow without subtracting the row max
  std::vector<int32_t> targets = {0, 1, 2, 3, 4, 5};
  const CrossEntropyResult r =
      *crossentropy_forward_backward(view(d, {kN, kVp}), view(logits, {kN, kVp}), view(targets, {kN}), kV);
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_NEAR(r.loss, reference_loss(testing::to_double(logits), targets), 1e4 * kTol);
  for (float g : d) EXPECT_TRUE(std::isfinite(g));
}

TEST(CrossEntropy, TargetInPaddingIsInvalidArgument) {
  std::vector<float> logits(kVp), d(kVp);
  std::vector<int32_t> targets = {kV};  // a padded column, not a real token
  EXPECT_EQ(
      crossentropy_forward_backward(view(d, {1, kVp}), view(logits, {1, kVp}), view(targets, {1}), kV).status().code(),
      absl::StatusCode::kInvalidArgument);
}

// A power-of-two loss scale inside the gradient's rounding: the unscaled gradient times the scale, bit for bit, and
// the same loss; in fp16 the scaled gradient keeps values the unscaled one flushes to zero.
TEST(CrossEntropy, ALossScaleScalesTheGradientBeforeItsRounding) {
  const int64_t n = 6, vocab = 200;
  std::vector<int32_t> targets = {3, kIgnoreIndex, 150, 0, 199, 42};
  std::vector<float> logits = random_floats(n * vocab, 51, -8.0f, 8.0f);
  std::vector<float> plain(n * vocab), scaled(n * vocab);
  const auto a =
      crossentropy_forward_backward(view(plain, {n, vocab}), view(logits, {n, vocab}), view(targets, {n}), vocab);
  const auto b = crossentropy_forward_backward(view(scaled, {n, vocab}), view(logits, {n, vocab}), view(targets, {n}),
                                               vocab, Tensor(), 1024.0f);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(b->loss, a->loss);
  for (float& x : plain) x *= 1024.0f;
  EXPECT_EQ(scaled, plain);
  std::vector<uint16_t> h(n * vocab), dh(n * vocab);
  for (int64_t i = 0; i < n * vocab; ++i) h[i] = float_to_fp16(logits[i]);
  const Tensor h_logits(h.data(), DType::kF16, {n, vocab}), h_grad(dh.data(), DType::kF16, {n, vocab});
  int64_t unscaled_zeros = 0, scaled_zeros = 0;
  for (const float loss_scale : {1.0f, 65536.0f}) {
    ASSERT_TRUE(crossentropy_forward_backward(h_grad, h_logits, view(targets, {n}), vocab, Tensor(), loss_scale).ok());
    (loss_scale == 1.0f ? unscaled_zeros : scaled_zeros) = std::count(dh.begin(), dh.end(), uint16_t{0});
  }
  EXPECT_EQ(scaled_zeros, vocab) << "the ignored row's alone";
  EXPECT_GT(unscaled_zeros, scaled_zeros + vocab / 2) << "fp16 flushes small probabilities unless scaled first";
}

// bf16 and fp16 logits: the fp32 kernel's loss, count and argmax hits on the widened logits, and its gradient rounded
// once, over a padded vocab with an ignored row; in place over the logits too.
class CrossEntropyInHalf : public ::testing::TestWithParam<DType> {};

TEST_P(CrossEntropyInHalf, GivesTheFp32BitsRounded) {
  const DType half = GetParam();
  const int64_t n = 12, vocab = 300, padded = 320;
  std::vector<int32_t> targets(n);
  for (int64_t r = 0; r < n; ++r) targets[r] = r == 5 ? kIgnoreIndex : static_cast<int32_t>(r * 37 % vocab);
  const Tensor tgt = view(targets, {n});
  const std::vector<float> logits = random_floats(n * padded, 31, -4.0f, 4.0f), d = random_floats(n * padded, 32);
  for (const bool in_place : {false, true}) {
    SCOPED_TRACE(absl::StrCat(dtype_name(half), in_place ? ", in place" : ""));
    std::vector<CrossEntropyResult> results;
    testing::expect_half_gives_the_fp32_bits_rounded(
        half, {{logits, {n, padded}}, {d, {n, padded}}}, [&](const auto& t) -> absl::Status {
          ZERO_ASSIGN_OR_RETURN(const CrossEntropyResult r,
                                crossentropy_forward_backward(in_place ? t[0] : t[1], t[0], tgt, vocab));
          results.push_back(r);
          return absl::OkStatus();
        });
    ASSERT_EQ(results.size(), 2u);
    EXPECT_EQ(results[1].loss, results[0].loss);
    EXPECT_EQ(results[1].counted, n - 1);
    EXPECT_EQ(results[1].correct, results[0].correct);
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16AndFp16, CrossEntropyInHalf, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace zero::kernels
