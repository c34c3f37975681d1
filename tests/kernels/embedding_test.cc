#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/kernels.h"

namespace zero::kernels {
namespace {

using testing::random_floats;
using testing::view;

constexpr int64_t kB = 2, kT = 3, kC = 5, kV = 4, kMaxT = 6;

TEST(Embedding, ForwardAddsTokenAndPositionRows) {
  std::vector<int32_t> tokens = {3, 0, 3, 1, 1, 2};
  std::vector<float> wte = random_floats(kV * kC, 1), wpe = random_floats(kMaxT * kC, 2), out(kB * kT * kC);
  ASSERT_TRUE(
      embedding_forward(view(out, {kB, kT, kC}), view(tokens, {kB, kT}), view(wte, {kV, kC}), view(wpe, {kMaxT, kC}))
          .ok());
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t t = 0; t < kT; ++t) {
      for (int64_t c = 0; c < kC; ++c) {
        EXPECT_EQ(out[(b * kT + t) * kC + c], wte[tokens[b * kT + t] * kC + c] + wpe[t * kC + c]);
      }
    }
  }
}

// Backward is a sum of dout rows: token 3 appears twice, token 1 twice, position t once per batch row.
TEST(Embedding, BackwardScattersIntoRepeatedTokensAndPositions) {
  std::vector<int32_t> tokens = {3, 0, 3, 1, 1, 2};
  std::vector<float> dout = random_floats(kB * kT * kC, 3);
  std::vector<float> dwte(kV * kC, 1.0f), dwpe(kMaxT * kC, 2.0f);  // prior gradients: backward adds
  ASSERT_TRUE(embedding_backward(view(dwte, {kV, kC}), view(dwpe, {kMaxT, kC}), view(dout, {kB, kT, kC}),
                                 view(tokens, {kB, kT}))
                  .ok());
  std::vector<float> want_wte(kV * kC, 1.0f), want_wpe(kMaxT * kC, 2.0f);
  for (int64_t r = 0; r < kB * kT; ++r) {  // the same additions in the same (row) order
    for (int64_t c = 0; c < kC; ++c) {
      want_wte[tokens[r] * kC + c] += dout[r * kC + c];
      want_wpe[(r % kT) * kC + c] += dout[r * kC + c];
    }
  }
  EXPECT_EQ(dwte, want_wte);
  EXPECT_EQ(dwpe, want_wpe);
}

TEST(Embedding, TokenOutsideVocabIsInvalidArgument) {
  std::vector<int32_t> tokens = {0, 1, 4, 0, 0, 0};
  std::vector<float> wte(kV * kC), wpe(kMaxT * kC), out(kB * kT * kC);
  EXPECT_EQ(
      embedding_forward(view(out, {kB, kT, kC}), view(tokens, {kB, kT}), view(wte, {kV, kC}), view(wpe, {kMaxT, kC}))
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(Embedding, SequenceLongerThanPositionsIsInvalidArgument) {
  std::vector<int32_t> tokens(7, 0);
  std::vector<float> wte(kV * kC), wpe(kMaxT * kC), out(7 * kC);
  EXPECT_EQ(embedding_forward(view(out, {1, 7, kC}), view(tokens, {1, 7}), view(wte, {kV, kC}), view(wpe, {kMaxT, kC}))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// bf16 and fp16: the fp32 kernels' bits on the widened tensors, rounded once, with a token repeated across rows and
// batches (its rows added in fp32 before the one rounding).
class EmbeddingInHalf : public ::testing::TestWithParam<DType> {};

TEST_P(EmbeddingInHalf, GivesTheFp32BitsRounded) {
  const DType half = GetParam();
  std::vector<int32_t> tokens = {3, 0, 3, 1, 3, 3};
  const Tensor tok = view(tokens, {kB, kT});
  const std::vector<float> wte = random_floats(kV * kC, 5), wpe = random_floats(kMaxT * kC, 6);
  const std::vector<float> rows = random_floats(kB * kT * kC, 7);
  SCOPED_TRACE(dtype_name(half));
  using testing::expect_half_gives_the_fp32_bits_rounded;
  expect_half_gives_the_fp32_bits_rounded(half, {{rows, {kB, kT, kC}}, {wte, {kV, kC}}, {wpe, {kMaxT, kC}}},
                                          [&](const auto& t) { return embedding_forward(t[0], tok, t[1], t[2]); });
  expect_half_gives_the_fp32_bits_rounded(half, {{wte, {kV, kC}}, {wpe, {kMaxT, kC}}, {rows, {kB, kT, kC}}},
                                          [&](const auto& t) { return embedding_backward(t[0], t[1], t[2], tok); });
}

INSTANTIATE_TEST_SUITE_P(Bf16AndFp16, EmbeddingInHalf, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace zero::kernels
