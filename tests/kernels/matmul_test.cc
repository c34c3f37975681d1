#include <cstring>
#include <string>
#include <thread>

#include "kernel_test_util.h"
#include "kernels/kernels.h"
#include "runtime/cpu_threads.h"

namespace zero::kernels {
namespace {

using testing::kU32;
using testing::random_floats;
using testing::view;

// out (N, OC) = inp (N, C) · weight (OC, C)^T + bias, in fp64.
std::vector<double> reference_matmul(const std::vector<double>& inp, const std::vector<double>& w,
                                     const std::vector<double>& b, int64_t n, int64_t c, int64_t oc) {
  std::vector<double> out(static_cast<size_t>(n * oc));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t o = 0; o < oc; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < c; ++i) s += inp[r * c + i] * w[o * c + i];
      out[r * oc + o] = s;
    }
  }
  return out;
}

// fp32 dot products of k terms, each of magnitude <= 1 (all data in [-1, 1]), plus a bias: whatever the
// summation order, |error| <= gamma_{k+1} * sum|terms| <= (k + 2) u k. 1e-8 covers the fp64 differences.
double gemm_tol(int64_t k) { return static_cast<double>(k + 2) * static_cast<double>(k) * kU32 + 1e-8; }

struct Problem {
  int64_t n, c, oc;
  std::vector<float> inp, w, b, dout;
  Problem(int64_t n_, int64_t c_, int64_t oc_, uint32_t seed)
      : n(n_), c(c_), oc(oc_), inp(random_floats(n * c, seed)), w(random_floats(oc * c, seed + 1)),
        b(random_floats(oc, seed + 2)), dout(random_floats(n * oc, seed + 3)) {}
};

struct Grads {
  std::vector<float> out, dinp, dw, db;
};

Grads run(Problem& p) {
  Grads g{std::vector<float>(p.n * p.oc), std::vector<float>(p.n * p.c), std::vector<float>(p.oc * p.c),
          std::vector<float>(p.oc)};
  EXPECT_TRUE(
      matmul_forward(view(g.out, {p.n, p.oc}), view(p.inp, {p.n, p.c}), view(p.w, {p.oc, p.c}), view(p.b, {p.oc}))
          .ok());
  EXPECT_TRUE(matmul_backward(view(g.dinp, {p.n, p.c}), view(g.dw, {p.oc, p.c}), view(g.db, {p.oc}),
                              view(p.dout, {p.n, p.oc}), view(p.inp, {p.n, p.c}), view(p.w, {p.oc, p.c}))
                  .ok());
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Matmul, ForwardMatchesReferenceOnLeadingDims) {
  const int64_t b = 2, t = 3, c = 7, oc = 5;
  std::vector<float> inp = random_floats(b * t * c, 1), w = random_floats(oc * c, 2), bias = random_floats(oc, 3);
  std::vector<float> out(b * t * oc);
  ASSERT_TRUE(matmul_forward(view(out, {b, t, oc}), view(inp, {b, t, c}), view(w, {oc, c}), view(bias, {oc})).ok());
  testing::expect_near_all(
      out, reference_matmul(testing::to_double(inp), testing::to_double(w), testing::to_double(bias), b * t, c, oc),
      gemm_tol(c), "out");
}

TEST(Matmul, ForwardWithoutBias) {
  const int64_t n = 4, c = 6, oc = 3;
  std::vector<float> inp = random_floats(n * c, 4), w = random_floats(oc * c, 5), out(n * oc, 99.0f);
  ASSERT_TRUE(matmul_forward(view(out, {n, oc}), view(inp, {n, c}), view(w, {oc, c}), Tensor()).ok());
  testing::expect_near_all(out, reference_matmul(testing::to_double(inp), testing::to_double(w), {}, n, c, oc),
                           gemm_tol(c), "out");
}

TEST(Matmul, ForwardAcrossManyTilesMatchesReference) {
  Problem p(300, 40, 520, 6);  // 2 x 2 tiles of 256 x 512, ragged at both edges
  const Grads g = run(p);
  testing::expect_near_all(
      g.out,
      reference_matmul(testing::to_double(p.inp), testing::to_double(p.w), testing::to_double(p.b), p.n, p.c, p.oc),
      gemm_tol(p.c), "out");
}

TEST(Matmul, BackwardMatchesFiniteDifferences) {
  Problem p(9, 11, 7, 7);
  const Grads g = run(p);
  const auto inp = testing::to_double(p.inp), w = testing::to_double(p.w), b = testing::to_double(p.b);
  auto loss_of = [&](const std::vector<double>& i, const std::vector<double>& ww, const std::vector<double>& bb) {
    return testing::weighted_sum(reference_matmul(i, ww, bb, p.n, p.c, p.oc), p.dout);
  };
  testing::expect_near_all(g.dinp, testing::numeric_grad(inp, [&](const auto& x) { return loss_of(x, w, b); }),
                           gemm_tol(p.oc), "dinp");
  testing::expect_near_all(g.dw, testing::numeric_grad(w, [&](const auto& x) { return loss_of(inp, x, b); }),
                           gemm_tol(p.n), "dweight");
  testing::expect_near_all(g.db, testing::numeric_grad(b, [&](const auto& x) { return loss_of(inp, w, x); }),
                           gemm_tol(p.n), "dbias");
}

TEST(Matmul, BackwardAddsIntoParameterGradientsAndWritesDinp) {
  Problem p(5, 4, 3, 8);
  const Grads fresh = run(p);
  std::vector<float> dinp(p.n * p.c, 123.0f), dw = random_floats(p.oc * p.c, 9), db = random_floats(p.oc, 10);
  const std::vector<float> dw0 = dw, db0 = db;
  ASSERT_TRUE(matmul_backward(view(dinp, {p.n, p.c}), view(dw, {p.oc, p.c}), view(db, {p.oc}),
                              view(p.dout, {p.n, p.oc}), view(p.inp, {p.n, p.c}), view(p.w, {p.oc, p.c}))
                  .ok());
  EXPECT_TRUE(same_bits(dinp, fresh.dinp));
  std::vector<double> dw_sum(dw.size()), db_sum(db.size());
  for (size_t i = 0; i < dw.size(); ++i) dw_sum[i] = double{dw0[i]} + fresh.dw[i];
  for (size_t i = 0; i < db.size(); ++i) db_sum[i] = double{db0[i]} + fresh.db[i];
  // The prior value joins the sum: one more rounding of a value below (k + 1) in magnitude.
  testing::expect_near_all(dw, dw_sum, gemm_tol(p.n), "dweight");
  testing::expect_near_all(db, db_sum, gemm_tol(p.n), "dbias");
}

TEST(Matmul, BackwardSkipsUndefinedDinpAndDbias) {
  Problem p(6, 5, 4, 11);
  const Grads fresh = run(p);
  std::vector<float> dw(p.oc * p.c, 0.0f);
  ASSERT_TRUE(matmul_backward(Tensor(), view(dw, {p.oc, p.c}), Tensor(), view(p.dout, {p.n, p.oc}),
                              view(p.inp, {p.n, p.c}), view(p.w, {p.oc, p.c}))
                  .ok());
  EXPECT_TRUE(same_bits(dw, fresh.dw));
}

TEST(Matmul, ShapeMismatchIsInvalidArgument) {
  Problem p(4, 5, 3, 12);
  std::vector<float> out(4 * 4);
  const absl::Status s = matmul_forward(view(out, {4, 4}), view(p.inp, {4, 5}), view(p.w, {3, 5}), view(p.b, {3}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out"), absl::string_view::npos) << s;
}

// A GEMM cannot write where it reads, nor two results into one buffer: each is refused naming both.
TEST(Matmul, AResultOverlappingWhatItReadsOrAnotherResultIsRefused) {
  const int64_t n = 4, c = 8, oc = 8;  // inp (n, c) and out (n, oc) the same size, so either fits the other's buffer
  std::vector<float> inp = random_floats(n * c, 1), w = random_floats(oc * c, 2), dout = random_floats(n * oc, 3);
  std::vector<float> dw(oc * c), db(oc), dinp(n * c);
  const auto expect_refused = [](const absl::Status& s, absl::string_view says) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(says), absl::string_view::npos) << s;
  };
  expect_refused(matmul_forward(view(inp, {n, oc}), view(inp, {n, c}), view(w, {oc, c}), Tensor()),
                 "out must not overlap inp");
  expect_refused(matmul_backward(view(dout, {n, c}), view(dw, {oc, c}), view(db, {oc}), view(dout, {n, oc}),
                                 view(inp, {n, c}), view(w, {oc, c})),
                 "dinp must not overlap dout");
  expect_refused(matmul_backward(view(dinp, {n, c}), view(w, {oc, c}), view(db, {oc}), view(dout, {n, oc}),
                                 view(inp, {n, c}), view(w, {oc, c})),
                 "dweight must not overlap weight");
  expect_refused(matmul_backward(view(dinp, {n, c}), view(dw, {oc, c}), Tensor(dw.data(), DType::kF32, {oc}),
                                 view(dout, {n, oc}), view(inp, {n, c}), view(w, {oc, c})),
                 "dweight must not overlap dbias");
}

TEST(Matmul, ResultsDoNotDependOnKernelThreads) {
  Problem p(300, 64, 400, 14);
  set_cpu_threads(1);
  const Grads one = run(p);
  set_cpu_threads(3);
  const Grads three = run(p);
  set_cpu_threads(1);
  EXPECT_TRUE(same_bits(one.out, three.out));
  EXPECT_TRUE(same_bits(one.dinp, three.dinp));
  EXPECT_TRUE(same_bits(one.dw, three.dw));
  EXPECT_TRUE(same_bits(one.db, three.db));
}

// Four rank-like threads run GEMMs at the same time on their own data, each with two kernel threads;
// every result equals, bit for bit, the same problem run alone on one thread.
TEST(Matmul, ConcurrentCallersMatchSingleThreadedBitForBit) {
  constexpr int kRanks = 4, kRepeats = 3;
  std::vector<Problem> problems;
  for (int r = 0; r < kRanks; ++r) problems.emplace_back(260, 96, 300, 100 + 10 * r);
  set_cpu_threads(1);
  std::vector<Grads> alone;
  for (Problem& p : problems) alone.push_back(run(p));
  std::vector<std::vector<Grads>> concurrent(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      set_cpu_threads(2);
      for (int i = 0; i < kRepeats; ++i) concurrent[r].push_back(run(problems[r]));
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    for (const Grads& g : concurrent[r]) {
      EXPECT_TRUE(same_bits(g.out, alone[r].out)) << "rank " << r;
      EXPECT_TRUE(same_bits(g.dinp, alone[r].dinp)) << "rank " << r;
      EXPECT_TRUE(same_bits(g.dw, alone[r].dw)) << "rank " << r;
      EXPECT_TRUE(same_bits(g.db, alone[r].db)) << "rank " << r;
    }
  }
}

// GELU fused after the GEMM, and GELU's backward into dinp's GEMM: in fp32, the separate calls' bits, nothing being
// rounded between them. The fp32 path is those two calls today; this holds a faster one to the same bits.
TEST(Matmul, WithGeluFusedGivesTheSeparateCallsBitsInFp32) {
  const int64_t n = 70, c = 48, oc = 40;
  Problem p(n, c, oc, 40);
  std::vector<float> pre_in = random_floats(n * c, 44, -3.0f, 3.0f);  // the backward's GELU input, where GELU' varies
  std::vector<float> out(n * oc), pre(n * oc), out2(n * oc), pre2(n * oc);
  ASSERT_TRUE(matmul_gelu_forward(view(out, {n, oc}), view(pre, {n, oc}), view(p.inp, {n, c}), view(p.w, {oc, c}),
                                  view(p.b, {oc}))
                  .ok());
  ASSERT_TRUE(matmul_forward(view(pre2, {n, oc}), view(p.inp, {n, c}), view(p.w, {oc, c}), view(p.b, {oc})).ok());
  ASSERT_TRUE(gelu_forward(view(out2, {n, oc}), view(pre2, {n, oc})).ok());
  EXPECT_TRUE(same_bits(pre, pre2));
  EXPECT_TRUE(same_bits(out, out2));

  Grads fused{{}, std::vector<float>(n * c), std::vector<float>(oc * c), std::vector<float>(oc)};
  Grads separate = fused;
  ASSERT_TRUE(matmul_backward_through_gelu(view(fused.dinp, {n, c}), view(fused.dw, {oc, c}), view(fused.db, {oc}),
                                           view(p.dout, {n, oc}), view(p.inp, {n, c}), view(pre_in, {n, c}),
                                           view(p.w, {oc, c}))
                  .ok());
  ASSERT_TRUE(matmul_backward(view(separate.dinp, {n, c}), view(separate.dw, {oc, c}), view(separate.db, {oc}),
                              view(p.dout, {n, oc}), view(p.inp, {n, c}), view(p.w, {oc, c}))
                  .ok());
  ASSERT_TRUE(gelu_backward(view(separate.dinp, {n, c}), view(pre_in, {n, c}), view(separate.dinp, {n, c})).ok());
  EXPECT_TRUE(same_bits(fused.dinp, separate.dinp));
  EXPECT_TRUE(same_bits(fused.dw, separate.dw));
  EXPECT_TRUE(same_bits(fused.db, separate.db));
}

TEST(Matmul, WithGeluFusedRefusesAMissingResultOrOneOverlappingWhatItReadsOrWrites) {
  const int64_t n = 4, c = 8, oc = 8;
  std::vector<float> inp = random_floats(n * c, 1), w = random_floats(oc * c, 2), buffer(2 * n * oc);
  absl::Status s = matmul_gelu_forward(view(buffer, {n, oc}), Tensor(buffer.data() + 1, DType::kF32, {n, oc}),
                                       view(inp, {n, c}), view(w, {oc, c}), Tensor());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("pre must not overlap out"), absl::string_view::npos) << s;
  std::vector<float> dout = random_floats(n * oc, 3), dw(oc * c), pre = random_floats(n * c, 4);
  s = matmul_backward_through_gelu(view(pre, {n, c}), view(dw, {oc, c}), Tensor(), view(dout, {n, oc}),
                                   view(inp, {n, c}), view(pre, {n, c}), view(w, {oc, c}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("dpre must not overlap pre"), absl::string_view::npos) << s;
  s = matmul_backward_through_gelu(Tensor(), view(dw, {oc, c}), Tensor(), view(dout, {n, oc}), view(inp, {n, c}),
                                   view(pre, {n, c}), view(w, {oc, c}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("dpre is its result"), absl::string_view::npos) << s;
  std::vector<float> dpre(n * c), pre_in_dw = random_floats(oc * c, 5);  // pre laid over dweight's first rows
  s = matmul_backward_through_gelu(view(dpre, {n, c}), view(pre_in_dw, {oc, c}), Tensor(), view(dout, {n, oc}),
                                   view(inp, {n, c}), Tensor(pre_in_dw.data(), DType::kF32, {n, c}), view(w, {oc, c}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("dweight must not overlap pre"), absl::string_view::npos) << s;
}

// The residual fused into the GEMM: in fp32 the separate calls' bits (matmul_forward, then residual_forward), which
// the fp32 path is today; out must lie apart from everything it reads.
TEST(Matmul, WithResidualFusedGivesTheSeparateCallsBitsInFp32) {
  const int64_t n = 70, c = 48, oc = 40;
  Problem p(n, c, oc, 50);
  std::vector<float> residual = random_floats(n * oc, 54);
  std::vector<float> fused(n * oc), separate(n * oc);
  ASSERT_TRUE(matmul_residual_forward(view(fused, {n, oc}), view(p.inp, {n, c}), view(p.w, {oc, c}), view(p.b, {oc}),
                                      view(residual, {n, oc}))
                  .ok());
  ASSERT_TRUE(matmul_forward(view(separate, {n, oc}), view(p.inp, {n, c}), view(p.w, {oc, c}), view(p.b, {oc})).ok());
  ASSERT_TRUE(residual_forward(view(separate, {n, oc}), view(separate, {n, oc}), view(residual, {n, oc})).ok());
  EXPECT_TRUE(same_bits(fused, separate));

  std::vector<float> in_place = residual;  // out aliasing the residual would be overwritten before it is read
  const absl::Status s = matmul_residual_forward(view(in_place, {n, oc}), view(p.inp, {n, c}), view(p.w, {oc, c}),
                                                 view(p.b, {oc}), view(in_place, {n, oc}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("out must not overlap residual"), absl::string_view::npos) << s;
  const absl::Status missing =
      matmul_residual_forward(view(fused, {n, oc}), view(p.inp, {n, c}), view(p.w, {oc, c}), view(p.b, {oc}), Tensor());
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument) << missing;
  EXPECT_NE(missing.message().find("residual must have shape"), absl::string_view::npos) << missing;
}

// bf16 and fp16 operands on the CPU: the fp32 GEMM on their widened values, every half result (out, dinp, dweight,
// dbias) rounded once; with fp32 results, the fp32 GEMM's own bits.
class MatmulInHalf : public ::testing::TestWithParam<DType> {};

// v's values rounded to `half`, as bits.
std::vector<uint16_t> rounded(DType half, const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = testing::round_to(half, v[i]);
  return h;
}

TEST_P(MatmulInHalf, GivesTheFp32BitsRounded) {
  const DType half = GetParam();
  const int64_t n = 70, c = 48, oc = 40;
  const std::vector<float> inp = random_floats(n * c, 1), w = random_floats(oc * c, 2), b = random_floats(oc, 3);
  const std::vector<float> dout = random_floats(n * oc, 4), out = random_floats(n * oc, 5);
  const std::vector<float> dinp = random_floats(n * c, 6), dw = random_floats(oc * c, 7), db = random_floats(oc, 8);
  SCOPED_TRACE(dtype_name(half));
  using testing::expect_half_gives_the_fp32_bits_rounded;
  expect_half_gives_the_fp32_bits_rounded(half, {{out, {n, oc}}, {inp, {n, c}}, {w, {oc, c}}, {b, {oc}}},
                                          [](const auto& t) { return matmul_forward(t[0], t[1], t[2], t[3]); });
  expect_half_gives_the_fp32_bits_rounded(
      half, {{dinp, {n, c}}, {dw, {oc, c}}, {db, {oc}}, {dout, {n, oc}}, {inp, {n, c}}, {w, {oc, c}}},
      [](const auto& t) { return matmul_backward(t[0], t[1], t[2], t[3], t[4], t[5]); });
  // fp32 results beside half operands (KernelArg's fp32: the same tensor in both calls).
  expect_half_gives_the_fp32_bits_rounded(
      half, {{dinp, {n, c}, true}, {dw, {oc, c}, true}, {db, {oc}, true}, {dout, {n, oc}}, {inp, {n, c}}, {w, {oc, c}}},
      [](const auto& t) { return matmul_backward(t[0], t[1], t[2], t[3], t[4], t[5]); });
}

// With GELU fused, a half call gives the fp32 call's bits rounded once: pre and out each from the unrounded sum, dpre
// from the unrounded product. The separate half calls round the sum (product) before GELU (its backward) and, on this
// data, land elsewhere.
TEST_P(MatmulInHalf, WithGeluFusedGivesTheFp32BitsRoundedOnce) {
  const DType half = GetParam();
  const int64_t n = 70, c = 48, oc = 40;
  const std::vector<float> inp = random_floats(n * c, 1), w = random_floats(oc * c, 2), b = random_floats(oc, 3);
  const std::vector<float> dout = random_floats(n * oc, 4), pre_in = random_floats(n * c, 5, -3.0f, 3.0f);
  const std::vector<float> zeros_out(n * oc), zeros_in(n * c), dw = random_floats(oc * c, 7), db = random_floats(oc, 8);
  SCOPED_TRACE(dtype_name(half));
  const auto forward = [](const auto& t) { return matmul_gelu_forward(t[0], t[1], t[2], t[3], t[4]); };
  const auto backward = [](const auto& t) {
    return matmul_backward_through_gelu(t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
  };
  using testing::expect_half_gives_the_fp32_bits_rounded;
  expect_half_gives_the_fp32_bits_rounded(
      half, {{zeros_out, {n, oc}}, {zeros_out, {n, oc}}, {inp, {n, c}}, {w, {oc, c}}, {b, {oc}}}, forward);
  expect_half_gives_the_fp32_bits_rounded(
      half,
      {{zeros_in, {n, c}}, {dw, {oc, c}}, {db, {oc}}, {dout, {n, oc}}, {inp, {n, c}}, {pre_in, {n, c}}, {w, {oc, c}}},
      backward);

  // The same half inputs through the separate calls.
  const auto bits = [&](const std::vector<float>& v) { return rounded(half, v); };
  std::vector<uint16_t> h_inp = bits(inp), h_w = bits(w), h_b = bits(b), h_dout = bits(dout), h_pre_in = bits(pre_in);
  const auto t = [&](std::vector<uint16_t>& v, Shape shape) { return Tensor(v.data(), half, std::move(shape)); };
  std::vector<uint16_t> out(n * oc), pre(n * oc), out2(n * oc), pre2(n * oc), dpre(n * c), dpre2(n * c);
  std::vector<float> dw32(oc * c), db32(oc);  // fp32 parameter gradients: not compared here
  ASSERT_TRUE(
      matmul_gelu_forward(t(out, {n, oc}), t(pre, {n, oc}), t(h_inp, {n, c}), t(h_w, {oc, c}), t(h_b, {oc})).ok());
  ASSERT_TRUE(matmul_forward(t(pre2, {n, oc}), t(h_inp, {n, c}), t(h_w, {oc, c}), t(h_b, {oc})).ok());
  ASSERT_TRUE(gelu_forward(t(out2, {n, oc}), t(pre2, {n, oc})).ok());
  EXPECT_EQ(pre, pre2) << "pre is the sum rounded once either way";
  EXPECT_NE(out, out2) << "GELU of the rounded sum";
  ASSERT_TRUE(matmul_backward_through_gelu(t(dpre, {n, c}), view(dw32, {oc, c}), view(db32, {oc}), t(h_dout, {n, oc}),
                                           t(h_inp, {n, c}), t(h_pre_in, {n, c}), t(h_w, {oc, c}))
                  .ok());
  ASSERT_TRUE(matmul_backward(t(dpre2, {n, c}), view(dw32, {oc, c}), view(db32, {oc}), t(h_dout, {n, oc}),
                              t(h_inp, {n, c}), t(h_w, {oc, c}))
                  .ok());
  ASSERT_TRUE(gelu_backward(t(dpre2, {n, c}), t(h_pre_in, {n, c}), t(dpre2, {n, c})).ok());
  EXPECT_NE(dpre, dpre2) << "GELU's backward of the rounded product";
}

// With the residual fused, a half call gives the fp32 call's bits rounded once: the sum plus the residual, where
// matmul_forward then residual_forward round the sum first and, on this data, land elsewhere.
TEST_P(MatmulInHalf, WithResidualFusedGivesTheFp32BitsRoundedOnce) {
  const DType half = GetParam();
  const int64_t n = 70, c = 48, oc = 40;
  const std::vector<float> inp = random_floats(n * c, 1), w = random_floats(oc * c, 2), b = random_floats(oc, 3);
  const std::vector<float> residual = random_floats(n * oc, 4), zeros(n * oc);
  SCOPED_TRACE(dtype_name(half));
  testing::expect_half_gives_the_fp32_bits_rounded(
      half, {{zeros, {n, oc}}, {inp, {n, c}}, {w, {oc, c}}, {b, {oc}}, {residual, {n, oc}}},
      [](const auto& t) { return matmul_residual_forward(t[0], t[1], t[2], t[3], t[4]); });

  const auto bits = [&](const std::vector<float>& v) { return rounded(half, v); };
  std::vector<uint16_t> h_inp = bits(inp), h_w = bits(w), h_b = bits(b), h_residual = bits(residual);
  const auto t = [&](std::vector<uint16_t>& v, Shape shape) { return Tensor(v.data(), half, std::move(shape)); };
  std::vector<uint16_t> fused(n * oc), separate(n * oc);
  ASSERT_TRUE(matmul_residual_forward(t(fused, {n, oc}), t(h_inp, {n, c}), t(h_w, {oc, c}), t(h_b, {oc}),
                                      t(h_residual, {n, oc}))
                  .ok());
  ASSERT_TRUE(matmul_forward(t(separate, {n, oc}), t(h_inp, {n, c}), t(h_w, {oc, c}), t(h_b, {oc})).ok());
  ASSERT_TRUE(residual_forward(t(separate, {n, oc}), t(separate, {n, oc}), t(h_residual, {n, oc})).ok());
  EXPECT_NE(fused, separate) << "the sum rounded before the residual's add";
}

INSTANTIATE_TEST_SUITE_P(Bf16AndFp16, MatmulInHalf, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace zero::kernels
