#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/kernels.h"
#include "runtime/cpu_threads.h"

namespace zero::kernels {
namespace {

using testing::kU32;
using testing::random_floats;
using testing::view;

struct RefLayerNorm {
  std::vector<double> out, mean, rstd;
};

RefLayerNorm reference_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>& b, int64_t n, int64_t c) {
  RefLayerNorm r{std::vector<double>(n * c), std::vector<double>(n), std::vector<double>(n)};
  for (int64_t i = 0; i < n; ++i) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < c; ++j) m += x[i * c + j] / c;
    for (int64_t j = 0; j < c; ++j) v += (x[i * c + j] - m) * (x[i * c + j] - m) / c;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    for (int64_t j = 0; j < c; ++j) r.out[i * c + j] = (x[i * c + j] - m) * s * w[j] + b[j];
    r.mean[i] = m;
    r.rstd[i] = s;
  }
  return r;
}

struct Problem {
  int64_t n, c;
  std::vector<float> x, w, b, dout;
  Problem(int64_t n_, int64_t c_, uint32_t seed)
      : n(n_), c(c_), x(random_floats(n * c, seed, -2.0f, 3.0f)), w(random_floats(c, seed + 1)),
        b(random_floats(c, seed + 2)), dout(random_floats(n * c, seed + 3)) {}
};

// Rows of C = 24 values in [-2, 3]: mean and variance each accumulate C fp32 terms (relative error
// <= (C + 2) u), rstd ~ 1/std <= 1/0.3 amplifies it by at most a few; xhat <= sqrt(C). 0.5e-4 leaves
// a margin of about 10 over (C + 2) u sqrt(C) / 0.3 * 2.
constexpr double kTol = 0.5e-4;

TEST(LayerNorm, ForwardMatchesReference) {
  Problem p(6, 24, 1);
  std::vector<float> out(p.n * p.c), mean(p.n), rstd(p.n);
  ASSERT_TRUE(layernorm_forward(view(out, {2, 3, p.c}), view(mean, {2, 3}), view(rstd, {2, 3}), view(p.x, {2, 3, p.c}),
                                view(p.w, {p.c}), view(p.b, {p.c}))
                  .ok());
  const RefLayerNorm r =
      reference_layernorm(testing::to_double(p.x), testing::to_double(p.w), testing::to_double(p.b), p.n, p.c);
  testing::expect_near_all(out, r.out, kTol, "out");
  testing::expect_near_all(mean, r.mean, kTol, "mean");
  testing::expect_near_all(rstd, r.rstd, kTol, "rstd");
}

// Runs forward then backward on p and checks dinp, dweight and dbias (added to prior values) against finite
// differences of the fp64 reference.
void expect_backward_matches_finite_differences(Problem p) {
  std::vector<float> out(p.n * p.c), mean(p.n), rstd(p.n), dx(p.n * p.c);
  std::vector<float> dw(p.c, 0.5f), db(p.c, -0.25f);  // prior gradients: backward adds to them
  ASSERT_TRUE(layernorm_forward(view(out, {p.n, p.c}), view(mean, {p.n}), view(rstd, {p.n}), view(p.x, {p.n, p.c}),
                                view(p.w, {p.c}), view(p.b, {p.c}))
                  .ok());
  ASSERT_TRUE(layernorm_backward(view(dx, {p.n, p.c}), view(dw, {p.c}), view(db, {p.c}), view(p.dout, {p.n, p.c}),
                                 view(p.x, {p.n, p.c}), view(p.w, {p.c}), view(mean, {p.n}), view(rstd, {p.n}))
                  .ok());
  const auto x = testing::to_double(p.x), w = testing::to_double(p.w), b = testing::to_double(p.b);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww, const std::vector<double>& bb) {
    return testing::weighted_sum(reference_layernorm(xx, ww, bb, p.n, p.c).out, p.dout);
  };
  testing::expect_near_all(dx, testing::numeric_grad(x, [&](const auto& v) { return loss(v, w, b); }), kTol, "dinp");
  std::vector<double> dw_expected = testing::numeric_grad(w, [&](const auto& v) { return loss(x, v, b); });
  std::vector<double> db_expected = testing::numeric_grad(b, [&](const auto& v) { return loss(x, w, v); });
  for (double& g : dw_expected) g += 0.5;
  for (double& g : db_expected) g -= 0.25;
  testing::expect_near_all(dw, dw_expected, kTol, "dweight");
  testing::expect_near_all(db, db_expected, kTol, "dbias");
}

TEST(LayerNorm, BackwardMatchesFiniteDifferencesAndAddsParameterGradients) {
  expect_backward_matches_finite_differences(Problem(5, 24, 2));
}

// More rows than one block of parameter-gradient partial sums (64), and C not a multiple of the 8 lanes.
TEST(LayerNorm, BackwardMatchesFiniteDifferencesOverSeveralBlocksAndARaggedRow) {
  expect_backward_matches_finite_differences(Problem(70, 27, 4));
}

TEST(LayerNorm, BackwardGivesTheSameBitsUnderAnyThreadCount) {
  Problem p(200, 27, 5);
  std::vector<float> out(p.n * p.c), mean(p.n), rstd(p.n);
  ASSERT_TRUE(layernorm_forward(view(out, {p.n, p.c}), view(mean, {p.n}), view(rstd, {p.n}), view(p.x, {p.n, p.c}),
                                view(p.w, {p.c}), view(p.b, {p.c}))
                  .ok());
  auto backward = [&](int threads) {
    set_cpu_threads(threads);
    std::vector<float> dx(p.n * p.c), dw(p.c), db(p.c);
    EXPECT_TRUE(layernorm_backward(view(dx, {p.n, p.c}), view(dw, {p.c}), view(db, {p.c}), view(p.dout, {p.n, p.c}),
                                   view(p.x, {p.n, p.c}), view(p.w, {p.c}), view(mean, {p.n}), view(rstd, {p.n}))
                    .ok());
    set_cpu_threads(1);
    dx.insert(dx.end(), dw.begin(), dw.end());
    dx.insert(dx.end(), db.begin(), db.end());
    return dx;
  };
  EXPECT_EQ(backward(1), backward(3));
}

// What a pre-LN block's x2 = x + a; ln_2(x2) and, backward, d(x2) = ln_2's gradient + dy give, in float bits: the
// separate kernels (`fused` false) or the fused ones.
// The returned x holds x + a.
std::vector<std::vector<float>> residual_layernorm_results(Problem p, std::vector<float> res, std::vector<float> dres,
                                                           bool fused) {
  std::vector<float> out(p.n * p.c), mean(p.n), rstd(p.n), dx(p.n * p.c), dw(p.c, 0.5f), db(p.c, -0.25f);
  const Tensor rows = view(p.x, {p.n, p.c}), w = view(p.w, {p.c}), b = view(p.b, {p.c}), g = view(p.dout, {p.n, p.c});
  absl::Status s;
  if (fused) {
    s.Update(residual_layernorm_forward(view(out, {p.n, p.c}), view(mean, {p.n}), view(rstd, {p.n}), rows,
                                        view(res, {p.n, p.c}), w, b));
    s.Update(layernorm_backward(view(dx, {p.n, p.c}), view(dw, {p.c}), view(db, {p.c}), g, rows, w, view(mean, {p.n}),
                                view(rstd, {p.n}), view(dres, {p.n, p.c})));
  } else {
    s.Update(residual_forward(rows, rows, view(res, {p.n, p.c})));
    s.Update(layernorm_forward(view(out, {p.n, p.c}), view(mean, {p.n}), view(rstd, {p.n}), rows, w, b));
    s.Update(layernorm_backward(view(dx, {p.n, p.c}), view(dw, {p.c}), view(db, {p.c}), g, rows, w, view(mean, {p.n}),
                                view(rstd, {p.n})));
    s.Update(residual_backward(view(dx, {p.n, p.c}), view(dres, {p.n, p.c})));
  }
  EXPECT_TRUE(s.ok()) << s;
  return {p.x, out, mean, rstd, dx, dw, db};
}

// The residual add fused before the LayerNorm, and its gradient after the backward, give the separate kernels' bits
// (compared as bytes, so a -0 or a NaN would count): over several blocks and a row not a multiple of the 8 lanes.
TEST(LayerNorm, WithTheResidualFusedGivesTheSeparateKernelsBits) {
  const Problem p(70, 27, 6);
  const std::vector<float> residual = random_floats(p.n * p.c, 7, -2.0f, 3.0f);
  const std::vector<float> dresidual = random_floats(p.n * p.c, 8);
  const auto separate = residual_layernorm_results(p, residual, dresidual, /*fused=*/false);
  const auto fused = residual_layernorm_results(p, residual, dresidual, /*fused=*/true);
  const char* names[] = {"inp + residual", "out", "mean", "rstd", "dinp", "dweight", "dbias"};
  for (size_t i = 0; i < separate.size(); ++i) {
    ASSERT_EQ(fused[i].size(), separate[i].size());
    EXPECT_EQ(std::memcmp(fused[i].data(), separate[i].data(), fused[i].size() * sizeof(float)), 0) << names[i];
  }
}

// bf16 and fp16: forward and backward (with and without the residual's gradient) give the fp32 kernels' bits on the
// widened tensors, rounded once; mean and rstd stay fp32. 70 rows of 27: several blocks, a row of ragged lanes.
class LayerNormInHalf : public ::testing::TestWithParam<DType> {};

TEST_P(LayerNormInHalf, GivesTheFp32BitsRounded) {
  const DType half = GetParam();
  const Problem p(70, 27, 9);
  const std::vector<float> mean = random_floats(p.n, 10, -0.5f, 0.5f), rstd = random_floats(p.n, 11, 0.5f, 2.0f);
  const std::vector<float> dx = random_floats(p.n * p.c, 12), dres = random_floats(p.n * p.c, 13);
  const std::vector<float> dw = random_floats(p.c, 14), db = random_floats(p.c, 15);
  const Shape rows = {p.n, p.c}, cols = {p.c}, stats = {p.n};
  using testing::expect_half_gives_the_fp32_bits_rounded;
  SCOPED_TRACE(dtype_name(half));
  expect_half_gives_the_fp32_bits_rounded(
      half, {{dx, rows}, {mean, stats, true}, {rstd, stats, true}, {p.x, rows}, {p.w, cols}, {p.b, cols}},
      [](const auto& t) { return layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5]); });
  for (const bool adds : {false, true}) {
    expect_half_gives_the_fp32_bits_rounded(half,
                                            {{dx, rows},
                                             {dw, cols},
                                             {db, cols},
                                             {p.dout, rows},
                                             {p.x, rows},
                                             {p.w, cols},
                                             {mean, stats, true},
                                             {rstd, stats, true},
                                             {dres, rows}},
                                            [adds](const auto& t) {
                                              return layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7],
                                                                        adds ? t[8] : Tensor());
                                            });
  }
}

// The fused forward in bf16/fp16 is still the residual add (rounded) and then the LayerNorm of what it stored.
TEST_P(LayerNormInHalf, WithTheResidualFusedGivesTheSeparateKernelsBits) {
  const DType half = GetParam();
  const Problem p(70, 27, 16);
  const auto rounded = [half](const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = testing::round_to(half, v[i]);
    return h;
  };
  const std::vector<uint16_t> w = rounded(p.w), b = rounded(p.b), res = rounded(random_floats(p.n * p.c, 17));
  const auto run = [&](bool fused) {
    std::vector<uint16_t> x = rounded(p.x), out(p.n * p.c);
    std::vector<float> mean(p.n), rstd(p.n);
    const auto t = [half](const std::vector<uint16_t>& v, Shape shape) {
      return Tensor(const_cast<uint16_t*>(v.data()), half, std::move(shape));
    };
    const Tensor rows = t(x, {p.n, p.c});
    absl::Status s = fused ? residual_layernorm_forward(t(out, {p.n, p.c}), view(mean, {p.n}), view(rstd, {p.n}), rows,
                                                        t(res, {p.n, p.c}), t(w, {p.c}), t(b, {p.c}))
                           : residual_forward(rows, rows, t(res, {p.n, p.c}));
    if (!fused) {
      s.Update(
          layernorm_forward(t(out, {p.n, p.c}), view(mean, {p.n}), view(rstd, {p.n}), rows, t(w, {p.c}), t(b, {p.c})));
    }
    EXPECT_TRUE(s.ok()) << s;
    return std::make_tuple(x, out, mean, rstd);
  };
  const auto [x, out, mean, rstd] = run(false);
  const auto [fused_x, fused_out, fused_mean, fused_rstd] = run(true);
  EXPECT_EQ(fused_x, x) << "inp + residual";
  EXPECT_EQ(fused_out, out);
  EXPECT_EQ(std::memcmp(fused_mean.data(), mean.data(), mean.size() * sizeof(float)), 0) << "mean";
  EXPECT_EQ(std::memcmp(fused_rstd.data(), rstd.data(), rstd.size() * sizeof(float)), 0) << "rstd";
}

INSTANTIATE_TEST_SUITE_P(Bf16AndFp16, LayerNormInHalf, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(LayerNorm, StatisticsInAnotherDtypeThanFp32AreInvalidArgument) {
  Problem p(4, 8, 3);
  std::vector<uint16_t> x(p.n * p.c), out(p.n * p.c), w(p.c), b(p.c), mean(p.n);
  std::vector<float> rstd(p.n);
  const absl::Status s =
      layernorm_forward(Tensor(out.data(), DType::kBF16, {p.n, p.c}), Tensor(mean.data(), DType::kBF16, {p.n}),
                        view(rstd, {p.n}), Tensor(x.data(), DType::kBF16, {p.n, p.c}),
                        Tensor(w.data(), DType::kBF16, {p.c}), Tensor(b.data(), DType::kBF16, {p.c}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("mean must be a contiguous fp32"), std::string::npos) << s;
}

TEST(LayerNorm, AResidualOfAnotherShapeIsInvalidArgument) {
  Problem p(4, 8, 3);
  std::vector<float> out(p.n * p.c), mean(p.n), rstd(p.n), residual(p.n * (p.c - 1));
  const absl::Status s =
      residual_layernorm_forward(view(out, {p.n, p.c}), view(mean, {p.n}), view(rstd, {p.n}), view(p.x, {p.n, p.c}),
                                 view(residual, {p.n, p.c - 1}), view(p.w, {p.c}), view(p.b, {p.c}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("residual"), std::string::npos) << s;
}

TEST(LayerNorm, MeanShapeMismatchIsInvalidArgument) {
  Problem p(4, 8, 3);
  std::vector<float> out(p.n * p.c), mean(3), rstd(p.n);
  EXPECT_EQ(layernorm_forward(view(out, {p.n, p.c}), view(mean, {3}), view(rstd, {p.n}), view(p.x, {p.n, p.c}),
                              view(p.w, {p.c}), view(p.b, {p.c}))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zero::kernels
