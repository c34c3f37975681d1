// The CUDA kernels against the CPU kernels on the same random inputs; every GPU test skips without a CUDA device.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "runtime/allocator.h"
#if ZERO_HAS_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif
#if ZERO_HAS_CUDNN
#include "kernels/cuda/cudnn_attention.h"
#endif
#include "runtime/device_memory.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/skip_without_gpu.h"

namespace zero::kernels {
namespace {

using testing::cast_inputs;
using testing::expect_near_all;
using testing::kU32;
using testing::random_floats;
using testing::view;

// Runs on cuda:0 with copies of host vectors; keeps the device buffers alive for the test.
class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_GPU(); }

  template <typename T>
  Tensor upload(const std::vector<T>& host, Shape shape) {
    auto buffer =
        allocator_.allocate(static_cast<int64_t>(host.size() * sizeof(T)), MemoryCategory::kWorkspace, Device::cuda(0));
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    Tensor t = buffer->tensor(DTypeOf<T>::value, std::move(shape));
    EXPECT_TRUE(copy_bytes(t.data(), t.device(), host.data(), Device::cpu(), t.nbytes()).ok());
    buffers_.push_back(*std::move(buffer));
    return t;
  }

  template <typename T>
  std::vector<T> download(const Tensor& t) {
    std::vector<T> host(static_cast<size_t>(t.numel()));
    EXPECT_TRUE(copy_bytes(host.data(), Device::cpu(), t.data(), t.device(), t.nbytes()).ok());
    return host;
  }

 private:
  Allocator allocator_;
  std::vector<Buffer> buffers_;
};

// v in `dtype`, as bytes: fp32 as it is, bf16/fp16 rounded to nearest even.
std::vector<uint8_t> bytes_in(DType dtype, const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) store_from_float(bytes.data(), dtype, i, v[i]);
  return bytes;
}

// Both sides sum K fp32 products in different orders; each sum's error is at most K·u·sum|a||b| (u = 2^-24)
// and |a|, |b| <= 1 here, so the two results differ by at most 2·K·u·K (and the += of an O(1) start value).
double gemm_tolerance(int64_t k) { return 2.0 * k * kU32 * k + 2 * kU32; }

// TF32 rounds each operand to an 11-bit significand: a relative error of at most 2^-10 (even truncating), so each
// product of |a|, |b| <= 1 moves by at most 2·2^-10 + 2^-20 and a sum of K of them by K·(2^-9 + 2^-20): K·2^-9 here,
// the K·2^-20 inside fp32's own gemm_tolerance (2·K²·2^-24 covers it from K = 8).
double tf32_tolerance(int64_t k) { return k * std::ldexp(1.0, -9) + gemm_tolerance(k); }

// An fp32 matmul forward and backward (bias, dinp, += dweight, += dbias) on the GPU against the CPU, the GEMMs within
// tolerance(K) of each other; the bias gradient, no GEMM, within fp64 sums' gemm_tolerance either way. 805 rows: the
// column sums in several row blocks (BiasGradientsOfManyRowsMatchCpu takes them further).
class CudaMatmul : public CudaKernels, public ::testing::WithParamInterface<Fp32Gemm> {};

TEST_P(CudaMatmul, MatchesCpu) {
  const Fp32Gemm gemm = GetParam();
  const auto tolerance = gemm == Fp32Gemm::kTf32 ? tf32_tolerance : gemm_tolerance;
  const int64_t n = 3 * 256 + 37, c = 96, oc = 80;
  std::vector<float> inp = random_floats(n * c, 1), w = random_floats(oc * c, 2), b = random_floats(oc, 3);
  std::vector<float> dout = random_floats(n * oc, 4), out(n * oc), dinp(n * c);
  std::vector<float> dw = random_floats(oc * c, 5), db = random_floats(oc, 6);
  const Tensor g_out = upload(out, {n, oc}), g_dinp = upload(dinp, {n, c}), g_dw = upload(dw, {oc, c});
  const Tensor g_db = upload(db, {oc}), g_inp = upload(inp, {n, c}), g_w = upload(w, {oc, c});
  ASSERT_TRUE(matmul_forward(view(out, {n, oc}), view(inp, {n, c}), view(w, {oc, c}), view(b, {oc})).ok());
  ASSERT_TRUE(matmul_forward(g_out, g_inp, g_w, upload(b, {oc}), gemm).ok());
  ASSERT_TRUE(matmul_backward(view(dinp, {n, c}), view(dw, {oc, c}), view(db, {oc}), view(dout, {n, oc}),
                              view(inp, {n, c}), view(w, {oc, c}))
                  .ok());
  ASSERT_TRUE(matmul_backward(g_dinp, g_dw, g_db, upload(dout, {n, oc}), g_inp, g_w, gemm).ok());
  expect_near_all(download<float>(g_out), out, tolerance(c) + kU32, "out");
  expect_near_all(download<float>(g_dinp), dinp, tolerance(oc), "dinp");
  expect_near_all(download<float>(g_dw), dw, tolerance(n), "dweight");
  expect_near_all(download<float>(g_db), db, gemm_tolerance(n), "dbias");  // fp64 sums: far tighter in fact
}

// The bias gradient's column sums where threads add many rows each, four at a time and then the rest, and the last
// row block adds more partials than a warp has lanes (200000 rows of 40 columns: on 132 SMs, 264 row blocks whose
// threads add 11 or 12 rows each), and over thousands
// of columns in a few row blocks (805 x 3005, a partial last chunk of columns): both sides round an fp64 sum of the
// same terms, so they differ by at most an ulp of the sum
// (|sum| < 4·sqrt(n) for n terms uniform in [-1, 1]: seven standard deviations) and one of the result, each at most
// 2u of the magnitude. A wrong row, column or block would move a sum by O(1).
TEST_F(CudaKernels, BiasGradientsOfManyRowsMatchCpu) {
  for (const auto& [n, oc] : std::vector<std::pair<int64_t, int64_t>>{{200000, 40}, {805, 3005}}) {
    const int64_t c = 8;
    std::vector<float> inp = random_floats(n * c, 60), w = random_floats(oc * c, 61), dout = random_floats(n * oc, 62);
    std::vector<float> dw(oc * c), db = random_floats(oc, 63);
    const Tensor g_dw = upload(dw, {oc, c}), g_db = upload(db, {oc});
    ASSERT_TRUE(matmul_backward(Tensor(), g_dw, g_db, upload(dout, {n, oc}), upload(inp, {n, c}), upload(w, {oc, c}),
                                Fp32Gemm::kExact)
                    .ok());
    ASSERT_TRUE(matmul_backward(Tensor(), view(dw, {oc, c}), view(db, {oc}), view(dout, {n, oc}), view(inp, {n, c}),
                                view(w, {oc, c}))
                    .ok());
    const std::vector<float> gpu = download<float>(g_db);
    for (int64_t j = 0; j < oc; ++j) {
      ASSERT_NEAR(gpu[j], db[j], 4 * kU32 * (std::fabs(db[j]) + std::sqrt(static_cast<double>(n)) * 4))
          << n << " x " << oc << ", column " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fp32AndTf32, CudaMatmul, ::testing::Values(Fp32Gemm::kExact, Fp32Gemm::kTf32),
                         [](const auto& info) { return info.param == Fp32Gemm::kTf32 ? "Tf32" : "Fp32"; });

// kTf32 reaches cuBLAS: on the tensor cores of sm_80 and later (the GPU check builds sm_90) operands rounded to 11
// significant bits change some of 256·256 sums of 256 products from the fp32 result; a dropped flag would leave
// every bit equal.
TEST_F(CudaKernels, Tf32GemmDiffersFromFp32) {
  const int64_t n = 256, c = 256, oc = 256;
  const Tensor g_inp = upload(random_floats(n * c, 51), {n, c}), g_w = upload(random_floats(oc * c, 52), {oc, c});
  std::vector<std::vector<float>> outs;
  for (const Fp32Gemm gemm : {Fp32Gemm::kExact, Fp32Gemm::kTf32}) {
    const Tensor g_out = upload(std::vector<float>(n * oc), {n, oc});
    ASSERT_TRUE(matmul_forward(g_out, g_inp, g_w, Tensor(), gemm).ok());
    outs.push_back(download<float>(g_out));
  }
  EXPECT_NE(outs[0], outs[1]);
}

// ---- bf16 / fp16 GEMMs ----

// Values rounded to `half` (nearest even), random ones in [lo, hi] or given: the bits for the GPU and their exact fp32
// widening for the CPU reference, so both sides multiply the same numbers.
struct HalfValues {
  std::vector<uint16_t> bits;
  std::vector<float> wide;
};
HalfValues half_values(DType half, std::vector<float> values) {
  HalfValues v{.bits = std::vector<uint16_t>(values.size()), .wide = std::move(values)};
  for (size_t i = 0; i < v.wide.size(); ++i) {
    v.bits[i] = testing::round_to(half, v.wide[i]);
    v.wide[i] = testing::widen(half, v.bits[i]);
  }
  return v;
}
HalfValues random_half(int64_t n, uint32_t seed, DType half, float lo = -1.0f, float hi = 1.0f) {
  return half_values(half, random_floats(n, seed, lo, hi));
}

// The unit roundoff of the single rounding into a half result: 2^-p for p significand bits (bf16 8, fp16 11).
double half_roundoff(DType half) { return half == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

// The tiled attention kernels for bf16/fp16 while it lives, where cuDNN would take the shape: the tests of the
// training precision's one rounding (cuDNN's fused attention rounds its probabilities too; CudnnAttention below).
#if ZERO_HAS_CUDA
class TiledAttention {
 public:
  TiledAttention() : previous_(cuda::set_cudnn_attention(false)) {}
  ~TiledAttention() { cuda::set_cudnn_attention(previous_); }
  TiledAttention(const TiledAttention&) = delete;
  TiledAttention& operator=(const TiledAttention&) = delete;

 private:
  const bool previous_;
};
#else
struct TiledAttention {
  TiledAttention() {}  // no CUDA kernels to choose between
};
#endif

// GPU kernels in bf16/fp16 (half()) against the CPU's fp32 kernel on the widened values: by the training precision's
// contract (kernels.h, proven on the CPU) that is the value the CPU's half kernel rounds once.
class CudaHalf : public CudaKernels, public ::testing::WithParamInterface<DType> {
 protected:
  DType half() const { return GetParam(); }

  // A device tensor of `dtype` (fp32 or half()) holding `v`: the half bits, or their widening in fp32.
  Tensor upload_as(const HalfValues& v, DType dtype, Shape shape) {
    if (dtype == DType::kF32) return upload(v.wide, std::move(shape));
    const Tensor t = upload(v.bits, shape);
    return Tensor(t.data(), dtype, std::move(shape), Device::cuda(0));
  }

  // g within `tol` of the CPU's fp32 values where the fp32 results differ by at most tol; a half result is rounded
  // once after: within half_roundoff·|x| of the fp32 value x it rounds, |x| <= |cpu| + tol; an fp16 result in the
  // subnormal range is instead within half its spacing, 2^-25, absolutely.
  void expect_result(const Tensor& g, const std::vector<float>& cpu, double tol, const std::string& what) {
    if (g.dtype() == DType::kF32) return expect_near_all(download<float>(g), cpu, tol, what);
    const std::vector<uint16_t> bits = download<uint16_t>(g);
    ASSERT_EQ(bits.size(), cpu.size()) << what;
    int misses = 0;
    for (size_t i = 0; i < bits.size() && misses < 5; ++i) {
      const double got = g.dtype() == DType::kBF16 ? bf16_to_float(bits[i]) : fp16_to_float(bits[i]);
      const double bound = half_roundoff(g.dtype()) * (std::fabs(cpu[i]) + tol) + tol + std::ldexp(1.0, -25);
      if (!(std::fabs(got - cpu[i]) <= bound)) {
        ADD_FAILURE() << what << " (" << dtype_name(g.dtype()) << ")[" << i << "]: " << got << " vs CPU " << cpu[i]
                      << " (tolerance " << bound << ")";
        ++misses;
      }
    }
  }

  // testing::expect_half_gives_the_fp32_bits_rounded on the GPU. Exact, as the CUDA kernels' fp32 and half
  // instantiations share their arithmetic: a second rounding, or a rounded value read back, shows as a changed bit.
  void expect_half_gives_the_fp32_bits_rounded(const std::vector<testing::KernelArg>& args,
                                               const std::function<absl::Status(const std::vector<Tensor>&)>& kernel) {
    testing::expect_half_gives_the_fp32_bits_rounded(half(), args, kernel, Device::cuda(0));
  }
};

// Both GEMMs multiply exactly (bf16·bf16 has <= 16 significant bits, fp16·fp16 <= 22: exact in fp32) and sum K
// products in fp32 in different orders: each within K·u·Σ|a||b| <= K·u·K of the exact sum (|a|, |b| <= 1), so
// gemm_tolerance(K) covers both; + u for the fp32 add of the O(1) bias or += start value.
class CudaHalfGemm : public CudaHalf {
 protected:
  // Forward and backward with half operands on the GPU against the fp32 CPU GEMM on their widened values;
  // out, bias, dinp, dweight and dbias all in `results` (fp32, or half() to round each once).
  void run(DType results) {
    const int64_t n = 64, c = 96, oc = 80;
    const DType h = half();
    const HalfValues inp = random_half(n * c, 31, h), w = random_half(oc * c, 32, h), b = random_half(oc, 33, h);
    const HalfValues dout = random_half(n * oc, 34, h), dw = random_half(oc * c, 35, h), db = random_half(oc, 36, h);
    std::vector<float> inp_c = inp.wide, w_c = w.wide, b_c = b.wide, dout_c = dout.wide, dw_c = dw.wide;
    std::vector<float> db_c = db.wide, out_c(n * oc), dinp_c(n * c);
    ASSERT_TRUE(matmul_forward(view(out_c, {n, oc}), view(inp_c, {n, c}), view(w_c, {oc, c}), view(b_c, {oc})).ok());
    ASSERT_TRUE(matmul_backward(view(dinp_c, {n, c}), view(dw_c, {oc, c}), view(db_c, {oc}), view(dout_c, {n, oc}),
                                view(inp_c, {n, c}), view(w_c, {oc, c}))
                    .ok());

    const HalfValues zeros_out{std::vector<uint16_t>(n * oc), std::vector<float>(n * oc)};
    const HalfValues zeros_dinp{std::vector<uint16_t>(n * c), std::vector<float>(n * c)};
    const Tensor g_inp = upload_as(inp, h, {n, c}), g_w = upload_as(w, h, {oc, c});
    const Tensor g_out = upload_as(zeros_out, results, {n, oc}), g_dinp = upload_as(zeros_dinp, results, {n, c});
    const Tensor g_dw = upload_as(dw, results, {oc, c}), g_db = upload_as(db, results, {oc});
    const absl::Status fwd = matmul_forward(g_out, g_inp, g_w, upload_as(b, results, {oc}));
    ASSERT_TRUE(fwd.ok()) << fwd;
    const absl::Status bwd = matmul_backward(g_dinp, g_dw, g_db, upload_as(dout, h, {n, oc}), g_inp, g_w);
    ASSERT_TRUE(bwd.ok()) << bwd;
    expect_result(g_out, out_c, gemm_tolerance(c) + kU32, "out");
    expect_result(g_dinp, dinp_c, gemm_tolerance(oc) + kU32, "dinp");
    expect_result(g_dw, dw_c, gemm_tolerance(n) + kU32, "dweight");
    expect_result(g_db, db_c, gemm_tolerance(n) + kU32, "dbias");  // fp64 column sums on both sides: far tighter
  }
};

TEST_P(CudaHalfGemm, Fp32ResultsMatchCpu) { run(DType::kF32); }
TEST_P(CudaHalfGemm, HalfResultsMatchCpu) { run(half()); }

INSTANTIATE_TEST_SUITE_P(Bf16AndFp16, CudaHalfGemm, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(info.param == DType::kBF16 ? "bf16" : "fp16");
                         });

// Integers uniform in [0, below), and quarters uniform in (-bound, bound): exact in fp32, bf16 and fp16 alike.
std::vector<float> small_integers(int64_t count, uint32_t seed, int below) {
  std::vector<float> v = random_floats(count, seed, 0.0f, static_cast<float>(below) - 0.001f);
  for (float& x : v) x = std::floor(x);
  return v;
}
std::vector<float> quarters(int64_t count, uint32_t seed, float bound) {
  std::vector<float> v = random_floats(count, seed, -bound, bound);
  for (float& x : v) x = std::round(4 * x) / 4;
  return v;
}

// What the two tests below share: a shape cuBLAS may split over K (16 x 16384 x 16), a small one, and GPT-2 tiny's
// attention and MLP GEMMs on a rank's 64 rows (the 50-step test's model). The forward's epilogues, which cuBLASLt
// runs, take GPT-2 124M's shapes at B = 8, T = 1024 as well: cuBLASLt picks its kernels by shape, and a kernel that
// rounds twice may serve only some. `below` keeps the sums under 2^17 and mostly past 2048, where fp16's integers end.
struct ExactGemmProblem {
  int64_t n, c, oc;
  int below;    // the operands' integers
  float bound;  // the added value's quarters
};
constexpr ExactGemmProblem kExactGemmProblems[] = {{16, 16384, 16, 2, 32.0f},
                                                   {64, 96, 80, 12, 4.0f},
                                                   {64, 32, 96, 20, 4.0f},
                                                   {64, 32, 32, 20, 4.0f},
                                                   {64, 128, 32, 12, 4.0f}};
constexpr ExactGemmProblem kGpt2Problems[] = {
    {8192, 768, 2304, 5, 32.0f}, {8192, 768, 768, 5, 32.0f}, {8192, 768, 3072, 5, 32.0f}, {8192, 3072, 768, 3, 32.0f}};

// The CPU's fp32 GEMM on the problems' integers: every product and partial sum an integer below 2^17, so exact in
// any order. out (N, OC) = inp (N, C) · w (OC, C)^T; dweight (OC, C) = dout (N, OC)^T · inp (N, C).
std::vector<float> exact_out(std::vector<float> inp, std::vector<float> w, int64_t n, int64_t c, int64_t oc) {
  std::vector<float> out(n * oc);
  EXPECT_TRUE(matmul_forward(view(out, {n, oc}), view(inp, {n, c}), view(w, {oc, c}), Tensor()).ok());
  return out;
}
std::vector<float> exact_dweight(std::vector<float> dout, std::vector<float> inp, int64_t n, int64_t c, int64_t oc) {
  std::vector<float> dweight(oc * c), w(oc * c);
  EXPECT_TRUE(matmul_backward(Tensor(), view(dweight, {oc, c}), Tensor(), view(dout, {n, oc}), view(inp, {n, c}),
                              view(w, {oc, c}))
                  .ok());
  return dweight;
}

// What `count` outputs must hold when output i, the exact sum sum_of(i) (integers below 2^17: exact in fp32, and with a
// quarter added) plus added(i), is rounded to h once; and what they would hold with the sum rounded first, which the
// test's data must tell apart.
struct Roundings {
  std::vector<uint16_t> once, twice;
};
Roundings round_sums(DType h, int64_t count, const std::function<double(int64_t)>& sum_of,
                     const std::function<float(int64_t)>& added) {
  Roundings r{std::vector<uint16_t>(count), std::vector<uint16_t>(count)};
  for (int64_t i = 0; i < count; ++i) {
    const auto sum32 = static_cast<float>(sum_of(i));
    r.once[i] = testing::round_to(h, sum32 + added(i));
    r.twice[i] = testing::round_to(h, testing::widen(h, testing::round_to(h, sum32)) + added(i));
  }
  EXPECT_NE(r.twice, r.once) << "the data must tell one rounding from two";
  return r;
}

// A half output's bias, and with matmul_residual_forward a residual, are added to the GEMM's fp32 sum, which is
// rounded once: in cuBLASLt's epilogue (bias in the output's dtype; the residual as its C matrix, apart from D), or
// unfused (an fp32 bias, a residual not 16-byte aligned), with split-K partials kept fp32 either way. Small
// non-negative integers make every product and partial sum exact in fp32, in any order, so the one right answer is
// round(exact sum + bias + residual) (quarters: their sum is exact too); the sums lie past half's integers (bf16 from
// 256, fp16 from 2048), where a sum rounded before the adds, or partials reduced in half, land elsewhere, and the test
// checks that its data tells them apart; it also checks which cases took cuBLASLt's epilogue, and that the residual
// is only read. N = OC = 16 with C = 16384 is a shape cuBLAS may split over K.
TEST_P(CudaHalf, GemmBiasAndResidualAreAddedToTheExactSumThenRoundedOnce) {
  const DType h = half();
  struct Case {
    std::optional<DType> bias;  // none: no bias
    bool residual, residual_misaligned;
    int64_t in_epilogue;  // GEMMs through cuBLASLt's epilogue
  };
  const Case cases[] = {{h, false, false, 1},          {DType::kF32, false, false, 0}, {h, true, false, 1},
                        {DType::kF32, true, false, 0}, {std::nullopt, true, false, 1}, {h, true, true, 0}};
  std::vector<ExactGemmProblem> problems(std::begin(kExactGemmProblems), std::end(kExactGemmProblems));
  problems.insert(problems.end(), std::begin(kGpt2Problems), std::end(kGpt2Problems));
  for (const ExactGemmProblem& p : problems) {
    const int64_t n = p.n, c = p.c, oc = p.oc;
    const std::vector<float> inp = small_integers(n * c, 50, p.below), w = small_integers(oc * c, 51, p.below + 1);
    const std::vector<float> bias = quarters(oc, 52, p.bound), residual = quarters(n * oc, 58, p.bound);
    const Tensor g_inp = upload_as(half_values(h, inp), h, {n, c}), g_w = upload_as(half_values(h, w), h, {oc, c});
    const HalfValues residual_h = half_values(h, residual);
    const std::vector<float> sums = exact_out(inp, w, n, c, oc);
    for (const Case& k : cases) {
      SCOPED_TRACE(absl::StrCat(n, "x", c, "x", oc, ", bias ", k.bias ? dtype_name(*k.bias) : "none",
                                k.residual ? ", residual" : "", k.residual_misaligned ? " one element in" : ""));
      const Roundings want = round_sums(
          h, n * oc, [&](int64_t i) { return sums[i]; },
          [&](int64_t i) { return (k.bias ? bias[i % oc] : 0.0f) + (k.residual ? residual[i] : 0.0f); });
      const Tensor out(upload(std::vector<uint16_t>(n * oc), {n, oc}).data(), h, {n, oc}, Device::cuda(0));
      const Tensor g_bias = k.bias ? upload_as(half_values(h, bias), *k.bias, {oc}) : Tensor();
      // The residual `residual_misaligned` elements into its buffer.
      std::vector<uint16_t> placed(k.residual_misaligned ? 1 : 0);
      placed.insert(placed.end(), residual_h.bits.begin(), residual_h.bits.end());
      const Tensor buffer = upload(placed, {static_cast<int64_t>(placed.size())});
      const Tensor g_residual(static_cast<uint16_t*>(buffer.data()) + (k.residual_misaligned ? 1 : 0), h, {n, oc},
                              Device::cuda(0));
#if ZERO_HAS_CUDA
      const int64_t fused_before = cuda::cublaslt_gemms_run();
#endif
      const absl::Status s = k.residual ? matmul_residual_forward(out, g_inp, g_w, g_bias, g_residual)
                                        : matmul_forward(out, g_inp, g_w, g_bias);
      ASSERT_TRUE(s.ok()) << s;
#if ZERO_HAS_CUDA
      EXPECT_EQ(cuda::cublaslt_gemms_run() - fused_before, k.in_epilogue) << "GEMMs in the epilogue";
#endif
      EXPECT_EQ(download<uint16_t>(out), want.once);
      EXPECT_EQ(download<uint16_t>(buffer), placed) << "the residual is only read";
    }
  }
}

// A half dweight's += adds the GEMM's fp32 sum to the old value in fp32 and rounds once, through an fp32 product and
// not cuBLASLt's epilogue (which rounded twice on an H200 in the second problem), aligned or not: the same exact
// integers as above (over K = N rows now: 16384 of them in the first problem), the old
// values quarters, so the one right answer is round(exact sum + old), which a sum rounded before the add misses on
// this data.
TEST_P(CudaHalf, WeightGradientIsAddedToTheExactSumThenRoundedOnce) {
  const DType h = half();
  for (const ExactGemmProblem& p : kExactGemmProblems) {
    const int64_t n = p.c, c = p.n, oc = p.oc;  // the long side as the rows summed over
    const std::vector<float> inp = small_integers(n * c, 53, p.below), dout = small_integers(n * oc, 54, p.below + 1);
    const std::vector<float> old = quarters(oc * c, 55, p.bound), sums = exact_dweight(dout, inp, n, c, oc);
    const Roundings want = round_sums(
        h, oc * c, [&](int64_t i) { return sums[i]; }, [&](int64_t i) { return old[i]; });
    const Tensor g_inp = upload_as(half_values(h, inp), h, {n, c});
    const Tensor g_dout = upload_as(half_values(h, dout), h, {n, oc});
    const Tensor g_w = upload_as(half_values(h, std::vector<float>(oc * c)), h, {oc, c});
    // Aligned, and one element into its buffer.
    for (const int64_t offset : {0, 1}) {
      std::vector<float> shifted(offset, 0.0f);
      shifted.insert(shifted.end(), old.begin(), old.end());
      const Tensor buffer = upload_as(half_values(h, shifted), h, {offset + oc * c});
      const Tensor dweight(static_cast<uint16_t*>(buffer.data()) + offset, h, {oc, c}, Device::cuda(0));
#if ZERO_HAS_CUDA
      const int64_t fused_before = cuda::cublaslt_gemms_run();
#endif
      const absl::Status s = matmul_backward(Tensor(), dweight, Tensor(), g_dout, g_inp, g_w);
      ASSERT_TRUE(s.ok()) << s;
#if ZERO_HAS_CUDA
      EXPECT_EQ(cuda::cublaslt_gemms_run() - fused_before, 0) << "GEMMs in the epilogue";
#endif
      EXPECT_EQ(download<uint16_t>(dweight), want.once) << n << " rows, " << oc << "x" << c << ", offset " << offset;
    }
  }
}

// A weight gradient's bits do not depend on where it lies: a stage-0 gradient bucket packs units at offsets that need
// not be 16-byte aligned, and the stages must agree bitwise. Random data (so a different GEMM algorithm, summing in
// another order, would show), dweight fp32 or half, one element into its buffer or not.
TEST_P(CudaHalf, WeightGradientsBitsDoNotDependOnWhereTheyLie) {
  const DType h = half();
  const int64_t n = 300, c = 72, oc = 40;
  const Tensor g_inp = upload_as(random_half(n * c, 56, h), h, {n, c});
  const Tensor g_dout = upload_as(random_half(n * oc, 57, h), h, {n, oc});
  const Tensor g_w = upload_as(random_half(oc * c, 58, h), h, {oc, c});
  for (const DType results : {DType::kF32, h}) {
    std::vector<std::vector<uint8_t>> bits;
    for (const int64_t offset : {0, 1}) {
      std::vector<float> old(offset, 0.0f);
      const std::vector<float> values = random_floats(oc * c, 59);
      old.insert(old.end(), values.begin(), values.end());
      const Tensor buffer = upload_as(half_values(h, old), results, {offset + oc * c});
      const Tensor dweight(static_cast<uint8_t*>(buffer.data()) + offset * dtype_size(results), results, {oc, c},
                           Device::cuda(0));
      ASSERT_TRUE(matmul_backward(Tensor(), dweight, Tensor(), g_dout, g_inp, g_w).ok());
      bits.push_back(download<uint8_t>(
          Tensor(dweight.data(), DType::kU8, {static_cast<int64_t>(dweight.nbytes())}, Device::cuda(0))));
    }
    EXPECT_EQ(bits[0].size(), static_cast<size_t>(oc * c * dtype_size(results)));
    EXPECT_EQ(bits[1], bits[0]) << dtype_name(results) << " dweight";
  }
}

// Runs in every build (the results' checks with CUDA only): half operands are checked before any dispatch;
// no data is touched.
TEST(CudaKernelChecks, HalfMatmulArgumentsAreChecked) {
  std::vector<uint16_t> x(4);
  const Tensor cpu_bf16(x.data(), DType::kBF16, {2, 2}), cpu_fp16(x.data(), DType::kF16, {2, 2});
  // inp and weight share one half dtype, and out is fp32 or that dtype, on every device.
  absl::Status s = matmul_forward(cpu_fp16, cpu_bf16, cpu_bf16, Tensor());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("fp32 or bf16"), absl::string_view::npos) << s;
  const Tensor bf16(x.data(), DType::kBF16, {2, 2}, Device::cuda(0)),
      fp16(x.data(), DType::kF16, {2, 2}, Device::cuda(0));
  const Tensor i32(x.data(), DType::kI32, {2, 2}, Device::cuda(0));
  s = matmul_forward(bf16, bf16, fp16, Tensor());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("weight"), absl::string_view::npos) << s;
#if ZERO_HAS_CUDA  // without CUDA, the backend's FailedPrecondition comes first for the results' checks
  s = matmul_backward(Tensor(), bf16, Tensor(), i32, bf16, bf16);  // dout must be bf16 like the operands
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("dout"), absl::string_view::npos) << s;
#endif
}

// GELU at |x| <= 5: the CPU's tanh_rational is within 7 ulps of glibc's tanhf (elementwise_test) and CUDA's tanhf
// within 2, so the two tanh values of |tanh| <= 1 differ by <= 9u; forward scales that by 0.5|x| <= 2.5, backward by
// |d local / d tanh| <= 0.5 + |x| sqrt(2/pi) (1 + 3·0.044715 x^2) <= 18; plus the final rounding.
constexpr double kGeluTol = 2.5 * 9 * kU32 + 5 * kU32;
constexpr double kGeluGradTol = 18 * 9 * kU32 + 18 * kU32;

// LayerNorm over rows of C values in [-1, 1]: row sums of C terms in another order make mean and variance differ by
// <= 2·C·u relative; with |xhat| = |x - mean|·rstd at most max_xhat (the CPU's, from its mean and rstd) and
// |weight| <= 1, out differs by about 2·C·u·max_xhat. Backward from the same saved mean and rstd: dinp's row sums of
// C terms of size <= max_xhat, times rstd ~ 1.7, within twice that; dweight and dbias are fp64 column sums over N
// rows, equal to a few ulps.
double layernorm_tolerance(const std::vector<float>& x, const std::vector<float>& mean, const std::vector<float>& rstd,
                           int64_t c) {
  double max_xhat = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    max_xhat = std::max(max_xhat, std::fabs((double{x[i]} - mean[i / c]) * rstd[i / c]));
  }
  return 2.0 * c * kU32 * max_xhat;
}

TEST_F(CudaKernels, GeluAndResidualMatchCpu) {
  const int64_t n = 10000;
  std::vector<float> x = random_floats(n, 7, -5.0f, 5.0f), dout = random_floats(n, 8), y(n), dx(n);
  const Tensor g_x = upload(x, {n}), g_y = upload(y, {n}), g_dx = upload(dx, {n}), g_dout = upload(dout, {n});
  ASSERT_TRUE(gelu_forward(view(y, {n}), view(x, {n})).ok());
  ASSERT_TRUE(gelu_forward(g_y, g_x).ok());
  ASSERT_TRUE(gelu_backward(view(dx, {n}), view(x, {n}), view(dout, {n})).ok());
  ASSERT_TRUE(gelu_backward(g_dx, g_x, g_dout).ok());
  expect_near_all(download<float>(g_y), y, kGeluTol, "gelu out");
  expect_near_all(download<float>(g_dx), dx, kGeluGradTol, "gelu dinp");
  // One IEEE add per element on both sides, from the same values (the GELU gradients above agree only
  // within tolerance, so the device's dx restarts from the host's): equal bits.
  ASSERT_TRUE(residual_forward(view(y, {n}), view(x, {n}), view(dout, {n})).ok());
  ASSERT_TRUE(residual_forward(g_y, g_x, g_dout).ok());
  const Tensor g_dx_from_host = upload(dx, {n});
  ASSERT_TRUE(residual_backward(view(dx, {n}), view(dout, {n})).ok());
  ASSERT_TRUE(residual_backward(g_dx_from_host, g_dout).ok());
  EXPECT_EQ(download<float>(g_y), y);
  EXPECT_EQ(download<float>(g_dx_from_host), dx);
}

// C = 203: each row ends in a partial chunk, and three rows in four start unaligned (common.cuh's element path).
// Rows a lane keeps in registers, forward and backward (203: one chunk of the four a lane can hold; 1000: four, the
// last partial), forward only (1600: GPT-2 XL's seven of eight) and rows read again in each pass (2100).
TEST_F(CudaKernels, LayerNormMatchesCpu) {
  for (const int64_t c : {203, 1000, 1600, 2100}) {
    SCOPED_TRACE(absl::StrCat("rows of ", c));
    const int64_t n = 32;
    std::vector<float> x = random_floats(n * c, 9), w = random_floats(c, 10), b = random_floats(c, 11);
    std::vector<float> dout = random_floats(n * c, 12), out(n * c), mean(n), rstd(n), dx(n * c);
    std::vector<float> dw = random_floats(c, 13), db = random_floats(c, 14);
    const Tensor g_x = upload(x, {n, c}), g_w = upload(w, {c}), g_out = upload(out, {n, c});
    const Tensor g_mean = upload(mean, {n}), g_rstd = upload(rstd, {n});
    ASSERT_TRUE(layernorm_forward(view(out, {n, c}), view(mean, {n}), view(rstd, {n}), view(x, {n, c}), view(w, {c}),
                                  view(b, {c}))
                    .ok());
    ASSERT_TRUE(layernorm_forward(g_out, g_mean, g_rstd, g_x, g_w, upload(b, {c})).ok());
    const double tol = layernorm_tolerance(x, mean, rstd, c);
    expect_near_all(download<float>(g_mean), mean, tol, "mean");
    expect_near_all(download<float>(g_rstd), rstd, tol * rstd[0], "rstd");
    expect_near_all(download<float>(g_out), out, tol, "out");
    const Tensor g_dx = upload(dx, {n, c}), g_dw = upload(dw, {c}), g_db = upload(db, {c});
    ASSERT_TRUE(
        layernorm_backward(g_dx, g_dw, g_db, upload(dout, {n, c}), g_x, g_w, upload(mean, {n}), upload(rstd, {n}))
            .ok());
    ASSERT_TRUE(layernorm_backward(view(dx, {n, c}), view(dw, {c}), view(db, {c}), view(dout, {n, c}), view(x, {n, c}),
                                   view(w, {c}), view(mean, {n}), view(rstd, {n}))
                    .ok());
    expect_near_all(download<float>(g_dx), dx, tol * 2, "dinp");
    expect_near_all(download<float>(g_dw), dw, 4 * n * kU32, "dweight");
    expect_near_all(download<float>(g_db), db, 4 * n * kU32, "dbias");
  }
}

// On the device the fused forms give the separate kernels' bits too: the residual add is one IEEE add either way, the
// row sums run in one order, and the gradient's add is never contracted into the product before it.
TEST_F(CudaKernels, LayerNormWithTheResidualFusedGivesTheSeparateKernelsBits) {
  const int64_t n = 70, c = 200;
  const std::vector<float> x = random_floats(n * c, 9), w = random_floats(c, 10), b = random_floats(c, 11);
  const std::vector<float> dout = random_floats(n * c, 12), res = random_floats(n * c, 13);
  const std::vector<float> dres = random_floats(n * c, 14), dw = random_floats(c, 15), db = random_floats(c, 16);
  // x + res, out, mean, rstd, dinp, dweight, dbias, as floats on the host.
  const auto run = [&](bool fused) {
    const Tensor g_x = upload(x, {n, c}), g_w = upload(w, {c}), g_b = upload(b, {c}), g_dout = upload(dout, {n, c});
    const Tensor g_res = upload(res, {n, c}), g_dres = upload(dres, {n, c});
    const Tensor g_out = upload(std::vector<float>(n * c), {n, c}), g_dx = upload(std::vector<float>(n * c), {n, c});
    const Tensor g_mean = upload(std::vector<float>(n), {n}), g_rstd = upload(std::vector<float>(n), {n});
    const Tensor g_dw = upload(dw, {c}), g_db = upload(db, {c});
    absl::Status s;
    if (fused) {
      s.Update(residual_layernorm_forward(g_out, g_mean, g_rstd, g_x, g_res, g_w, g_b));
      s.Update(layernorm_backward(g_dx, g_dw, g_db, g_dout, g_x, g_w, g_mean, g_rstd, g_dres));
    } else {
      s.Update(residual_forward(g_x, g_x, g_res));
      s.Update(layernorm_forward(g_out, g_mean, g_rstd, g_x, g_w, g_b));
      s.Update(layernorm_backward(g_dx, g_dw, g_db, g_dout, g_x, g_w, g_mean, g_rstd));
      s.Update(residual_backward(g_dx, g_dres));
    }
    EXPECT_TRUE(s.ok()) << s;
    return std::vector<std::vector<float>>{download<float>(g_x),    download<float>(g_out), download<float>(g_mean),
                                           download<float>(g_rstd), download<float>(g_dx),  download<float>(g_dw),
                                           download<float>(g_db)};
  };
  const auto separate = run(false), fused = run(true);
  const char* names[] = {"inp + residual", "out", "mean", "rstd", "dinp", "dweight", "dbias"};
  for (size_t i = 0; i < separate.size(); ++i) {
    ASSERT_EQ(fused[i].size(), separate[i].size());
    EXPECT_EQ(std::memcmp(fused[i].data(), separate[i].data(), fused[i].size() * sizeof(float)), 0) << names[i];
  }
}

// Every kernel of the training precision on the GPU, against the GPU's own fp32 kernel on the same numbers, bit for
// bit (the GEMMs aside: cuBLAS accumulates half and fp32 products differently). LayerNorm's backward with the
// residual's gradient, the embedding's repeated tokens and the cross-entropy in place are where a second rounding would
// hide.
TEST_P(CudaHalf, EachKernelGivesItsFp32BitsRounded) {
  const int64_t n = 70, c = 203;  // rows and the whole ending in partial chunks (common.cuh)
  const Shape rows = {n, c}, cols = {c}, stats = {n};
  const auto r = [](int64_t size, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    return random_floats(size, seed, lo, hi);
  };
  SCOPED_TRACE(dtype_name(half()));
  // One kernel per call: a chain would compare rounded inputs in half against unrounded ones in fp32.
  const std::vector<testing::KernelArg> three = {{r(n * c, 1, -5, 5), rows}, {r(n * c, 2), rows}, {r(n * c, 3), rows}};
  expect_half_gives_the_fp32_bits_rounded(three, [](const auto& t) { return gelu_forward(t[1], t[0]); });
  expect_half_gives_the_fp32_bits_rounded(three, [](const auto& t) { return gelu_backward(t[2], t[0], t[2]); });
  expect_half_gives_the_fp32_bits_rounded(three, [](const auto& t) { return residual_forward(t[1], t[1], t[0]); });
  expect_half_gives_the_fp32_bits_rounded(three, [](const auto& t) { return residual_backward(t[2], t[1]); });
  expect_half_gives_the_fp32_bits_rounded(
      {{r(n * c, 4), rows},
       {r(n, 5), stats, true},
       {r(n, 6), stats, true},
       {r(n * c, 7), rows},
       {r(c, 8), cols},
       {r(c, 9), cols}},
      [](const auto& t) { return layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5]); });
  expect_half_gives_the_fp32_bits_rounded(
      {{r(n * c, 10), rows},
       {r(c, 11), cols},
       {r(c, 12), cols},
       {r(n * c, 13), rows},
       {r(n * c, 14), rows},
       {r(c, 15), cols},
       {r(n, 16, -0.5f, 0.5f), stats, true},
       {r(n, 17, 0.5f, 2.0f), stats, true},
       {r(n * c, 18), rows}},
      [](const auto& t) { return layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]); });
  const int64_t b = 4, t = 64, vocab = 50, max_t = 70, emb = 40;
  std::vector<int32_t> tokens(b * t);
  for (int64_t i = 0; i < b * t; ++i) tokens[i] = static_cast<int32_t>(i % 3 == 0 ? 7 : (i * 31) % vocab);
  const Tensor g_tokens = upload(tokens, {b, t});
  const std::vector<testing::KernelArg> embedding = {
      {r(vocab * emb, 19), {vocab, emb}}, {r(max_t * emb, 20), {max_t, emb}}, {r(b * t * emb, 21), {b, t, emb}}};
  expect_half_gives_the_fp32_bits_rounded(embedding,
                                          [&](const auto& x) { return embedding_forward(x[2], g_tokens, x[0], x[1]); });
  expect_half_gives_the_fp32_bits_rounded(
      embedding, [&](const auto& x) { return embedding_backward(x[0], x[1], x[2], g_tokens); });
  const int64_t padded = 136, classes = 130;
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = i % 5 == 0 ? kIgnoreIndex : static_cast<int32_t>((i * 37) % classes);
  const Tensor g_targets = upload(targets, {n});
  expect_half_gives_the_fp32_bits_rounded({{r(n * padded, 24, -4, 4), {n, padded}}}, [&](const auto& x) {
    return crossentropy_forward_backward(x[0], x[0], g_targets, classes).status();
  });
  const int64_t nh = 2, hs = 40, ac = nh * hs, at = 45;
  const std::vector<testing::KernelArg> attention = {
      {r(2 * at * 3 * ac, 25), {2, at, 3 * ac}},
      {r(2 * at * ac, 26), {2, at, ac}},
      {r(2 * nh * at, 27, 1.0f, 3.0f), {2, nh, at}, true},
      {r(2 * at * ac, 28), {2, at, ac}},
      {r(2 * at * 3 * ac, 29), {2, at, 3 * ac}}};  // inp, out, lse, dout, dinp
  const TiledAttention tiled;
  expect_half_gives_the_fp32_bits_rounded(attention,
                                          [&](const auto& x) { return attention_forward(x[1], x[2], x[0], nh); });
  expect_half_gives_the_fp32_bits_rounded(
      attention, [&](const auto& x) { return attention_backward(x[4], x[3], x[0], x[1], x[2], nh); });
}

// The fused forward on the GPU in bf16/fp16 is the residual add, rounded, then the LayerNorm of what it stored.
TEST_P(CudaHalf, LayerNormWithTheResidualFusedGivesTheSeparateKernelsBits) {
  const int64_t n = 70, c = 200;
  const DType h = half();
  const HalfValues x = random_half(n * c, 9, h), res = random_half(n * c, 10, h), w = random_half(c, 11, h);
  const HalfValues b = random_half(c, 12, h);
  const HalfValues zeros{std::vector<uint16_t>(n * c), std::vector<float>(n * c)};
  std::vector<std::vector<uint16_t>> results[2];
  std::vector<std::vector<float>> stats[2];
  for (const bool fused : {false, true}) {
    const Tensor g_x = upload_as(x, h, {n, c}), g_res = upload_as(res, h, {n, c}), g_out = upload_as(zeros, h, {n, c});
    const Tensor g_mean = upload(std::vector<float>(n), {n}), g_rstd = upload(std::vector<float>(n), {n});
    const Tensor g_w = upload_as(w, h, {c}), g_b = upload_as(b, h, {c});
    absl::Status s = fused ? residual_layernorm_forward(g_out, g_mean, g_rstd, g_x, g_res, g_w, g_b)
                           : residual_forward(g_x, g_x, g_res);
    if (!fused) s.Update(layernorm_forward(g_out, g_mean, g_rstd, g_x, g_w, g_b));
    ASSERT_TRUE(s.ok()) << s;
    results[fused] = {download<uint16_t>(g_x), download<uint16_t>(g_out)};
    stats[fused] = {download<float>(g_mean), download<float>(g_rstd)};
  }
  EXPECT_EQ(results[1], results[0]) << "inp + residual, out";
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(std::memcmp(stats[1][i].data(), stats[0][i].data(), n * sizeof(float)), 0) << (i == 0 ? "mean" : "rstd");
  }
}

// GELU and the residual add in bf16/fp16 on the GPU: within the fp32 kernels' tolerances of the CPU's fp32 values on
// the same inputs, then rounded once; the adds, one IEEE add of the same numbers on both sides, to the bit.
TEST_P(CudaHalf, GeluAndResidualMatchCpu) {
  const int64_t n = 10000;
  const DType h = half();
  const HalfValues x = random_half(n, 7, h, -5.0f, 5.0f), dout = random_half(n, 8, h);
  std::vector<float> x_c = x.wide, dout_c = dout.wide, y(n), dx(n), sum(n), dsum = x.wide;
  ASSERT_TRUE(gelu_forward(view(y, {n}), view(x_c, {n})).ok());
  ASSERT_TRUE(gelu_backward(view(dx, {n}), view(x_c, {n}), view(dout_c, {n})).ok());
  ASSERT_TRUE(residual_forward(view(sum, {n}), view(x_c, {n}), view(dout_c, {n})).ok());
  ASSERT_TRUE(residual_backward(view(dsum, {n}), view(dout_c, {n})).ok());
  const HalfValues zeros{std::vector<uint16_t>(n), std::vector<float>(n)};
  const Tensor g_x = upload_as(x, h, {n}), g_dout = upload_as(dout, h, {n}), g_dsum = upload_as(x, h, {n});
  const Tensor g_y = upload_as(zeros, h, {n}), g_dx = upload_as(zeros, h, {n}), g_sum = upload_as(zeros, h, {n});
  absl::Status s = gelu_forward(g_y, g_x);
  s.Update(gelu_backward(g_dx, g_x, g_dout));
  s.Update(residual_forward(g_sum, g_x, g_dout));
  s.Update(residual_backward(g_dsum, g_dout));
  ASSERT_TRUE(s.ok()) << s;
  expect_result(g_y, y, kGeluTol, "gelu out");
  expect_result(g_dx, dx, kGeluGradTol, "gelu dinp");
  for (const auto& [g, cpu, what] :
       {std::tuple(g_sum, sum, "residual out"), std::tuple(g_dsum, dsum, "residual dinp")}) {
    std::vector<uint16_t> rounded(cpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) rounded[i] = testing::round_to(h, cpu[i]);
    EXPECT_EQ(download<uint16_t>(g), rounded) << what;
  }
}

// Multiples of scale/64 in [-scale, scale] (scale a power of two, or 3): at most 8 significant bits, exact in fp32,
// bf16 and fp16; products of two have more bits than fp16 keeps, and a sum of a few thousand of them is exact in fp32
// in any order.
std::vector<float> sixty_fourths(int64_t count, uint32_t seed, float scale = 1.0f) {
  std::vector<float> v = random_floats(count, seed, -64.499f, 64.499f);
  for (float& x : v) x = std::round(x) * scale / 64;
  return v;
}

// How many of `got`'s half values lie further from `want` (fp32) than its one rounding after a difference of at most
// slack(i): |got - want| <= u (|want| + slack) + slack, as expect_result. Reports the first few as failures when
// `report`.
int outside(DType h, const std::vector<uint16_t>& got, const std::vector<float>& want,
            const std::function<double(size_t)>& slack, bool report, const std::string& what) {
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = testing::widen(h, got[i]), bound = half_roundoff(h) * (std::fabs(want[i]) + slack(i)) + slack(i);
    if (std::fabs(g - want[i]) <= bound) continue;
    if (report && misses < 5) {
      ADD_FAILURE() << what << " (" << dtype_name(h) << ")[" << i << "]: " << g << " vs " << want[i] << " (tolerance "
                    << bound << ")";
    }
    ++misses;
  }
  return misses;
}

// GELU fused into the GEMMs in bf16/fp16 on the GPU: the forward in cuBLASLt's epilogue where every tensor is 16-byte
// aligned (counted), unfused where GELU's results lie one element in; the backward always on an fp32 product, since
// cuBLASLt's DGELU epilogue rounded the product before multiplying on an H200 (the 97 bf16 elements below).
// sixty_fourths make every GEMM sum exact in any order, so what is left to differ from the CPU's GELU on the exact sum
// is GELU's own arithmetic and the one rounding. cuBLASLt does not document its GELU's tanh and may take the hardware's
// tanh.approx.f32 (PTX ISA: relative error at most 2^-11), so the two tanh values may differ by 2^-11 + 9u (9u:
// tanhf's and tanh_rational's own); out then by 0.5|x| times that at GELU's input x, and GELU'(x) by
// (0.5 + |x| sqrt(2/pi) (1 + 3·0.044715 x^2)) times it, scaled by |dout · weight|. The pre-activation is the exact sum
// rounded once, to the bit. The test checks that its data tells that apart from GELU (its backward) of the sum
// (product) rounded first, so a rounding between GEMM and GELU fails it (at 64 x 96 x 128, bf16: 605 and 97 of the
// elements; fp16: 37 in forward, none in backward, where the slack is wider than fp16's u). GPT-2 124M's MLP shape
// (8192 x 768 x 3072) runs too: its sums, at most 768 in size in multiples of 2^-14, are still exact.
TEST_P(CudaHalf, GeluInTheGemmEpilogueMatchesCpu) {
  const DType h = half();
  for (const std::array<int64_t, 3>& shape : {std::array<int64_t, 3>{64, 96, 128}, {8192, 768, 3072}}) {
    const int64_t n = shape[0], c = shape[1], oc = shape[2];
    SCOPED_TRACE(absl::StrCat(n, "x", c, "x", oc));
    const std::vector<float> inp = sixty_fourths(n * c, 61), w = sixty_fourths(oc * c, 62, 0.25f);
    const std::vector<float> b = sixty_fourths(oc, 63), dout = sixty_fourths(n * oc, 64);
    const std::vector<float> pre_in = sixty_fourths(n * c, 65, 3.0f);  // the backward's GELU input
    // On the CPU in fp32, exact sums: sum = inp · w^T + b, out = GELU(sum); acc = dout · w, dpre = GELU'(pre_in) · acc.
    std::vector<float> inp_c = inp, w_c = w, b_c = b, dout_c = dout, pre_c = pre_in;
    std::vector<float> sum(n * oc), out(n * oc), acc(n * c), dpre(n * c), dw_unused(oc * c);
    ASSERT_TRUE(matmul_forward(view(sum, {n, oc}), view(inp_c, {n, c}), view(w_c, {oc, c}), view(b_c, {oc})).ok());
    ASSERT_TRUE(gelu_forward(view(out, {n, oc}), view(sum, {n, oc})).ok());
    ASSERT_TRUE(matmul_backward(view(acc, {n, c}), view(dw_unused, {oc, c}), Tensor(), view(dout_c, {n, oc}),
                                view(inp_c, {n, c}), view(w_c, {oc, c}))
                    .ok());
    ASSERT_TRUE(gelu_backward(view(dpre, {n, c}), view(pre_c, {n, c}), view(acc, {n, c})).ok());
    const double tanh_diff = std::ldexp(1.0, -11) + 9 * kU32;
    const auto out_slack = [&](size_t i) { return 0.5 * std::fabs(sum[i]) * tanh_diff; };
    const auto dpre_slack = [&](size_t i) {
      const double x = std::fabs(pre_c[i]);
      return (0.5 + x * 0.7979 * (1 + 0.134145 * x * x)) * tanh_diff * std::fabs(acc[i]);
    };
    std::vector<uint16_t> want_pre(n * oc), out_of_rounded(n * oc), dpre_of_rounded(n * c);
    for (int64_t i = 0; i < n * oc; ++i) want_pre[i] = testing::round_to(h, sum[i]);
    {  // GELU (its backward) of the sum (product) rounded first, on the CPU
      std::vector<float> rounded_sum(n * oc), rounded_acc(n * c), gelu_of(n * oc), dgelu_of(n * c);
      for (int64_t i = 0; i < n * oc; ++i) rounded_sum[i] = testing::widen(h, want_pre[i]);
      for (int64_t i = 0; i < n * c; ++i) rounded_acc[i] = testing::widen(h, testing::round_to(h, acc[i]));
      ASSERT_TRUE(gelu_forward(view(gelu_of, {n, oc}), view(rounded_sum, {n, oc})).ok());
      ASSERT_TRUE(gelu_backward(view(dgelu_of, {n, c}), view(pre_c, {n, c}), view(rounded_acc, {n, c})).ok());
      for (int64_t i = 0; i < n * oc; ++i) out_of_rounded[i] = testing::round_to(h, gelu_of[i]);
      for (int64_t i = 0; i < n * c; ++i) dpre_of_rounded[i] = testing::round_to(h, dgelu_of[i]);
    }
    EXPECT_GT(outside(h, out_of_rounded, out, out_slack, false, ""), 0) << "the data must tell one rounding from two";
    if (h == DType::kBF16) {  // in fp16, an approximate tanh's slack in GELU' is as wide as the rounding itself
      EXPECT_GT(outside(h, dpre_of_rounded, dpre, dpre_slack, false, ""), 0)
          << "the data must tell one rounding from two";
    }

    const auto halves = [&](const std::vector<float>& v) { return half_values(h, v); };
    for (const int64_t offset : {0, 1}) {
      SCOPED_TRACE(offset == 0 ? "aligned: cuBLASLt's epilogue" : "one element in: unfused");
      const auto zeros_placed = [&](Shape shape) {  // `offset` elements into their buffer
        const int64_t count = offset + shape_numel(shape);
        const Tensor buffer =
            upload_as(HalfValues{std::vector<uint16_t>(count), std::vector<float>(count)}, h, {count});
        return Tensor(static_cast<uint16_t*>(buffer.data()) + offset, h, std::move(shape), Device::cuda(0));
      };
      const Tensor g_out = zeros_placed({n, oc}), g_pre = zeros_placed({n, oc}), g_dpre = zeros_placed({n, c});
      const Tensor g_inp = upload_as(halves(inp), h, {n, c}), g_w = upload_as(halves(w), h, {oc, c});
      // An fp32 dweight (its += takes cuBLAS; a half one would take no cuBLASLt epilogue either).
      const Tensor g_dw = upload(std::vector<float>(oc * c), {oc, c});
#if ZERO_HAS_CUDA
      const int64_t fused_before = cuda::cublaslt_gemms_run();
#endif
      absl::Status st = matmul_gelu_forward(g_out, g_pre, g_inp, g_w, upload_as(halves(b), h, {oc}));
      st.Update(matmul_backward_through_gelu(g_dpre, g_dw, Tensor(), upload_as(halves(dout), h, {n, oc}), g_inp,
                                             upload_as(halves(pre_in), h, {n, c}), g_w));
      ASSERT_TRUE(st.ok()) << st;
#if ZERO_HAS_CUDA
      EXPECT_EQ(cuda::cublaslt_gemms_run() - fused_before, offset == 0 ? 1 : 0) << "GEMMs in the epilogue";
#endif
      EXPECT_EQ(download<uint16_t>(g_pre), want_pre) << "pre: the exact sum rounded once";
      EXPECT_EQ(outside(h, download<uint16_t>(g_out), out, out_slack, true, "out"), 0);
      EXPECT_EQ(outside(h, download<uint16_t>(g_dpre), dpre, dpre_slack, true, "dpre"), 0);
    }
  }
}

// LayerNorm in bf16/fp16 on the GPU, forward with the residual fused and backward with its gradient, against the
// CPU's fp32 kernels on the same values (the fused add in fp32 on the CPU is the rounded one on the GPU: the CPU adds
// the residual in half first, as the GPU's kernel stores it). Tolerances as for fp32, then rounded once.
TEST_P(CudaHalf, LayerNormMatchesCpu) {
  const int64_t n = 70, c = 200;
  const DType h = half();
  const HalfValues x = random_half(n * c, 9, h), res = random_half(n * c, 10, h), w = random_half(c, 11, h);
  const HalfValues b = random_half(c, 12, h), dout = random_half(n * c, 13, h), dres = random_half(n * c, 14, h);
  const HalfValues dw = random_half(c, 15, h), db = random_half(c, 16, h);
  // The CPU's residual stream, added and rounded in the training precision, then widened: what both normalize.
  std::vector<uint16_t> sum_bits = x.bits;
  const Tensor cpu_sum(sum_bits.data(), h, {n, c});
  ASSERT_TRUE(residual_forward(cpu_sum, cpu_sum, Tensor(const_cast<uint16_t*>(res.bits.data()), h, {n, c})).ok());
  std::vector<float> x_c(n * c), w_c = w.wide, b_c = b.wide, out(n * c), mean(n), rstd(n);
  for (int64_t i = 0; i < n * c; ++i) x_c[i] = testing::widen(h, sum_bits[i]);
  ASSERT_TRUE(layernorm_forward(view(out, {n, c}), view(mean, {n}), view(rstd, {n}), view(x_c, {n, c}), view(w_c, {c}),
                                view(b_c, {c}))
                  .ok());
  std::vector<float> dout_c = dout.wide, dres_c = dres.wide, dx(n * c), dw_c = dw.wide, db_c = db.wide;
  ASSERT_TRUE(layernorm_backward(view(dx, {n, c}), view(dw_c, {c}), view(db_c, {c}), view(dout_c, {n, c}),
                                 view(x_c, {n, c}), view(w_c, {c}), view(mean, {n}), view(rstd, {n}),
                                 view(dres_c, {n, c}))
                  .ok());

  const HalfValues zeros{std::vector<uint16_t>(n * c), std::vector<float>(n * c)};
  const Tensor g_x = upload_as(x, h, {n, c}), g_w = upload_as(w, h, {c}), g_out = upload_as(zeros, h, {n, c});
  const Tensor g_mean = upload(std::vector<float>(n), {n}), g_rstd = upload(std::vector<float>(n), {n});
  ASSERT_TRUE(
      residual_layernorm_forward(g_out, g_mean, g_rstd, g_x, upload_as(res, h, {n, c}), g_w, upload_as(b, h, {c}))
          .ok());
  EXPECT_EQ(download<uint16_t>(g_x), sum_bits) << "inp + residual: one add, rounded once, on both";
  const double tol = layernorm_tolerance(x_c, mean, rstd, c);
  expect_near_all(download<float>(g_mean), mean, tol, "mean");
  expect_near_all(download<float>(g_rstd), rstd, tol * rstd[0], "rstd");
  expect_result(g_out, out, tol, "out");
  // Backward from the CPU's mean and rstd, so only the sums' order differs.
  const Tensor g_dx = upload_as(zeros, h, {n, c}), g_dw = upload_as(dw, h, {c}), g_db = upload_as(db, h, {c});
  ASSERT_TRUE(layernorm_backward(g_dx, g_dw, g_db, upload_as(dout, h, {n, c}), g_x, g_w, upload(mean, {n}),
                                 upload(rstd, {n}), upload_as(dres, h, {n, c}))
                  .ok());
  expect_result(g_dx, dx, tol * 2, "dinp");
  expect_result(g_dw, dw_c, 4 * n * kU32, "dweight");
  expect_result(g_db, db_c, 4 * n * kU32, "dbias");
}

INSTANTIATE_TEST_SUITE_P(Bf16AndFp16, CudaHalf, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The backward's rows grouped by CUB's radix sort: a small batch with repeats (one sort tile), GPT-2's batch over its
// vocabulary (CUB's multi-pass path, tokens drawn at random, so runs of one and of many), and a vocabulary of one.
TEST_F(CudaKernels, EmbeddingMatchesCpuBitwise) {
  struct Case {
    int64_t b, t, c, vocab;
  };
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Case& k : {Case{3, 7, 40, 11}, Case{8, 1024, 8, 50257}, Case{2, 5, 8, 1}}) {
      SCOPED_TRACE(absl::StrCat(dtype_name(dtype), ", B ", k.b, ", T ", k.t, ", V ", k.vocab));
      const int64_t b = k.b, t = k.t, c = k.c, vocab = k.vocab, max_t = t + 2;
      std::vector<int32_t> tokens(b * t);
      for (int64_t i = 0; i < b * t; ++i) {
        // Repeats: a few frequent tokens among draws spread over the vocabulary.
        tokens[i] = static_cast<int32_t>(i % 3 == 0 ? (i * 5) % 4 % vocab : (i * 2654435761u) % vocab);
      }
      // wte, wpe, out, dout, dwte, dwpe in `dtype`, as bytes on the host and on the GPU.
      std::vector<std::vector<uint8_t>> host = {
          bytes_in(dtype, random_floats(vocab * c, 15)),  bytes_in(dtype, random_floats(max_t * c, 16)),
          bytes_in(dtype, std::vector<float>(b * t * c)), bytes_in(dtype, random_floats(b * t * c, 17)),
          bytes_in(dtype, random_floats(vocab * c, 18)),  bytes_in(dtype, random_floats(max_t * c, 19))};
      const std::vector<Shape> shapes = {{vocab, c}, {max_t, c}, {b, t, c}, {b, t, c}, {vocab, c}, {max_t, c}};
      std::vector<Tensor> cpu, gpu;
      for (size_t i = 0; i < host.size(); ++i) {
        cpu.emplace_back(host[i].data(), dtype, shapes[i]);
        gpu.emplace_back(upload(host[i], {static_cast<int64_t>(host[i].size())}).data(), dtype, shapes[i],
                         Device::cuda(0));
      }
      const Tensor g_tok = upload(tokens, {b, t});
      absl::Status s = embedding_forward(cpu[2], view(tokens, {b, t}), cpu[0], cpu[1]);
      s.Update(embedding_backward(cpu[4], cpu[5], cpu[3], view(tokens, {b, t})));
      s.Update(embedding_forward(gpu[2], g_tok, gpu[0], gpu[1]));
      s.Update(embedding_backward(gpu[4], gpu[5], gpu[3], g_tok));
      ASSERT_TRUE(s.ok()) << s;
      // One add per element forward; backward adds each gradient row in increasing row order on both sides, in fp32,
      // and rounds each sum once.
      for (const int i : {2, 4, 5}) {
        std::vector<uint8_t> back(host[i].size());
        ASSERT_TRUE(copy_bytes(back.data(), Device::cpu(), gpu[i].data(), gpu[i].device(), back.size()).ok());
        EXPECT_TRUE(back == host[i]) << (i == 2 ? "out" : i == 4 ? "dwte" : "dwpe");
      }
    }
  }
}

// 16 rows, and 1000 (more than the sums' block has threads, so each sums a run of rows); no rows at all. Rows of 136
// fp32 logits are copied into shared memory first, rows of 133 (532 bytes, not a multiple of 16) read where they lie.
TEST_F(CudaKernels, CrossEntropyMatchesCpu) {
  for (const auto& [n, padded] :
       {std::pair<int64_t, int64_t>{16, 136}, {1000, 136}, {0, 136}, {16, 133}, {1000, 133}}) {
    const int64_t vocab = 130;
    std::vector<float> logits = random_floats(n * padded, 20, -4.0f, 4.0f), dlogits(n * padded);
    std::vector<int32_t> targets(n);
    for (int64_t r = 0; r < n; ++r) targets[r] = r % 5 == 0 ? kIgnoreIndex : static_cast<int32_t>((r * 37) % vocab);
    const Tensor g_d = upload(dlogits, {n, padded});
    auto cpu =
        crossentropy_forward_backward(view(dlogits, {n, padded}), view(logits, {n, padded}), view(targets, {n}), vocab);
    auto gpu = crossentropy_forward_backward(g_d, upload(logits, {n, padded}), upload(targets, {n}), vocab);
    ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
    SCOPED_TRACE(absl::StrCat(n, " rows of ", padded));
    EXPECT_EQ(gpu->counted, cpu->counted);
    EXPECT_EQ(gpu->correct, cpu->correct);
    // expf vs std::exp (<= 2 ulps), the fp64 sum's order (negligible), and the loss's final rounding. The GPU's
    // online softmax takes a term as expf(x - m) · exp(m - max) for its thread's max m at the time: expf's 2 ulps
    // again, the fp64 factor and product adding ~2^-52 each, so each term is still within ~2 ulps of exp(x - max),
    // and a sum of positive terms keeps their relative error.
    EXPECT_NEAR(gpu->loss, cpu->loss, 4 * kU32 * std::fabs(cpu->loss));
    if (n == 0) continue;
    // Each gradient is p·(scale/sum) [- scale]: a few roundings of values <= scale = 1/counted.
    const double scale = 1.0 / static_cast<double>(cpu->counted);
    expect_near_all(download<float>(g_d), dlogits, 8 * kU32 * scale, "dlogits");
  }
}

// Rows wider than a block's 2048-element stride, so each thread's online softmax rescales its sum as its max grows:
// random rows, and rows ascending (a new max in every chunk) and descending (never one after the first); the same
// bounds as above. Rows of 5008 and 11264 fp32 logits.
TEST_F(CudaKernels, CrossEntropyOfWideRowsMatchesCpu) {
  for (const int64_t padded : {5008, 11264}) {
    SCOPED_TRACE(absl::StrCat("rows of ", padded));
    const int64_t n = 48, vocab = padded - 5;
    std::vector<float> logits = random_floats(n * padded, 64, -4.0f, 4.0f), dlogits(n * padded);
    for (int64_t v = 0; v < vocab; ++v) {
      logits[v] = -4.0f + 8.0f * static_cast<float>(v) / vocab;          // row 0 ascending
      logits[padded + v] = 4.0f - 8.0f * static_cast<float>(v) / vocab;  // row 1 descending
    }
    std::vector<int32_t> targets(n);
    for (int64_t r = 0; r < n; ++r) targets[r] = static_cast<int32_t>((r * 997) % vocab);
    const Tensor g_d = upload(dlogits, {n, padded});
    auto cpu =
        crossentropy_forward_backward(view(dlogits, {n, padded}), view(logits, {n, padded}), view(targets, {n}), vocab);
    auto gpu = crossentropy_forward_backward(g_d, upload(logits, {n, padded}), upload(targets, {n}), vocab);
    ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
    EXPECT_EQ(gpu->correct, cpu->correct);
    EXPECT_NEAR(gpu->loss, cpu->loss, 4 * kU32 * std::fabs(cpu->loss));
    expect_near_all(download<float>(g_d), dlogits, 8 * kU32 / static_cast<double>(cpu->counted), "dlogits");
  }
}

// bf16/fp16 logits on the GPU, in place as GPT-2 runs it, against the CPU's fp32 kernel on the widened logits: the
// fp32 test's tolerances, the gradient then rounded once.
TEST_P(CudaHalf, CrossEntropyMatchesCpu) {
  const int64_t n = 1000, padded = 136, vocab = 130;
  const HalfValues logits = random_half(n * padded, 20, half(), -4.0f, 4.0f);
  std::vector<int32_t> targets(n);
  for (int64_t r = 0; r < n; ++r) targets[r] = r % 5 == 0 ? kIgnoreIndex : static_cast<int32_t>((r * 37) % vocab);
  std::vector<float> dlogits(n * padded);
  const Tensor g_logits = upload_as(logits, half(), {n, padded});
  std::vector<float> cpu_logits = logits.wide;
  auto cpu = crossentropy_forward_backward(view(dlogits, {n, padded}), view(cpu_logits, {n, padded}),
                                           view(targets, {n}), vocab);
  auto gpu = crossentropy_forward_backward(g_logits, g_logits, upload(targets, {n}), vocab);
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
  EXPECT_EQ(gpu->counted, cpu->counted);
  EXPECT_EQ(gpu->correct, cpu->correct);
  EXPECT_NEAR(gpu->loss, cpu->loss, 4 * kU32 * std::fabs(cpu->loss));
  expect_result(g_logits, dlogits, 8 * kU32 / static_cast<double>(cpu->counted), "dlogits");
}

// Rows the CPU's argmax takes column 0 of, as the GPU's must: a NaN first logit (the CPU's fold keeps it) beside a
// larger one, a row of -inf, and a row of -inf and NaN; and a NaN past the first column, which no argmax takes. Each
// row's target is the CPU's argmax, so both count all four: in fp32 and half(), with rows of 136 logits (read as
// 16-byte vectors) and of 133 (not a multiple of 16 bytes: partly element by element).
TEST_P(CudaHalf, CrossEntropyCountsTheCpusArgmaxOverNanAndInfiniteRows) {
  const int64_t n = 4, vocab = 130;
  for (const DType dtype : {DType::kF32, half()}) {
    for (const int64_t padded : {136, 133}) {
      SCOPED_TRACE(absl::StrCat(dtype_name(dtype), " rows of ", padded));
      std::vector<float> values = random_floats(n * padded, 21, -4.0f, 4.0f), dlogits(n * padded);
      values[0] = NAN, values[5] = 9.0f;
      std::fill_n(values.begin() + padded, vocab, -INFINITY);
      for (int64_t v = 0; v < vocab; ++v) values[2 * padded + v] = v % 2 == 0 ? -INFINITY : NAN;
      values[3 * padded + 7] = NAN, values[3 * padded + 3] = 9.0f;
      const HalfValues logits = half_values(half(), values);  // .wide: exact in half() and fp32 alike
      std::vector<float> cpu_logits = logits.wide;
      std::vector<int32_t> targets = {0, 0, 0, 3};
      auto cpu = crossentropy_forward_backward(view(dlogits, {n, padded}), view(cpu_logits, {n, padded}),
                                               view(targets, {n}), vocab);
      const Tensor g_logits = upload_as(logits, dtype, {n, padded});
      auto gpu = crossentropy_forward_backward(g_logits, g_logits, upload(targets, {n}), vocab);
      ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
      EXPECT_EQ(cpu->correct, 4);
      EXPECT_EQ(gpu->correct, cpu->correct);
    }
  }
}

// Shapes for the tiled kernels (64 query or key rows a block, 32 streamed, head dims padded to 64, 128 or 256): one
// partial tile; several tiles with partial ones at the end; and each padded head size, 256 with its split key pass.
struct AttentionShape {
  int64_t b, t, nh, hs;
};
constexpr AttentionShape kAttentionShapes[] = {{2, 17, 3, 40}, {1, 150, 2, 64}, {1, 70, 1, 100}, {1, 45, 1, 200}};

TEST_F(CudaKernels, AttentionMatchesCpuAndRepeatsBitwise) {
  for (const auto& [b, t, nh, hs] : kAttentionShapes) {
    SCOPED_TRACE(absl::StrCat("B ", b, " T ", t, " NH ", nh, " hs ", hs));
    const int64_t c = nh * hs;
    std::vector<float> inp = random_floats(b * t * 3 * c, 21), dout = random_floats(b * t * c, 22);
    std::vector<float> out(b * t * c), lse(b * nh * t), dinp(b * t * 3 * c);
    const Tensor g_inp = upload(inp, {b, t, 3 * c}), g_out = upload(out, {b, t, c}), g_lse = upload(lse, {b, nh, t});
    ASSERT_TRUE(attention_forward(view(out, {b, t, c}), view(lse, {b, nh, t}), view(inp, {b, t, 3 * c}), nh).ok());
    ASSERT_TRUE(attention_forward(g_out, g_lse, g_inp, nh).ok());
    // A score is scale·(hs products of |.| <= 1) summed in another order: |ds| <= 2·hs·u·hs·scale. Softmax moves
    // each probability by <= 2 p |ds|, so out (a convex mix of |v| <= 1) and lse move by about 2|ds|, plus T
    // roundings (the GPU's fp32 sums of at most T terms, against the CPU's fp64 ones).
    const double ds = 2.0 * hs * kU32 * hs / std::sqrt(static_cast<double>(hs));
    const double tol = 2 * ds + t * kU32;
    const std::vector<float> g_out_host = download<float>(g_out), g_lse_host = download<float>(g_lse);
    expect_near_all(g_out_host, out, tol, "out");
    expect_near_all(g_lse_host, lse, tol, "lse");
    // Backward from the CPU's out and lse on both sides; each gradient sums <= T terms, each off by about the
    // forward's tolerance times |dout · v| <= hs.
    const Tensor g_dinp = upload(dinp, {b, t, 3 * c}), g_dout = upload(dout, {b, t, c});
    const Tensor g_cpu_out = upload(out, {b, t, c}), g_cpu_lse = upload(lse, {b, nh, t});
    ASSERT_TRUE(attention_backward(view(dinp, {b, t, 3 * c}), view(dout, {b, t, c}), view(inp, {b, t, 3 * c}),
                                   view(out, {b, t, c}), view(lse, {b, nh, t}), nh)
                    .ok());
    ASSERT_TRUE(attention_backward(g_dinp, g_dout, g_inp, g_cpu_out, g_cpu_lse, nh).ok());
    const std::vector<float> g_dinp_host = download<float>(g_dinp);
    expect_near_all(g_dinp_host, dinp, t * tol * hs, "dinp");
    // No atomics: a second run writes the same bits.
    ASSERT_TRUE(attention_forward(g_out, g_lse, g_inp, nh).ok());
    ASSERT_TRUE(attention_backward(g_dinp, g_dout, g_inp, g_cpu_out, g_cpu_lse, nh).ok());
    EXPECT_EQ(download<float>(g_out), g_out_host);
    EXPECT_EQ(download<float>(g_lse), g_lse_host);
    EXPECT_EQ(download<float>(g_dinp), g_dinp_host);
  }
}

// q, k, v, out and the gradients in bf16/fp16 on the GPU, against the CPU's fp32 kernels on the same (widened)
// numbers: the fp32 test's tolerances, each result then rounded once. The backward reads the CPU's out, rounded.
TEST_P(CudaHalf, AttentionMatchesCpu) {
  const TiledAttention tiled;
  for (const auto& [b, t, nh, hs] : kAttentionShapes) {
    SCOPED_TRACE(absl::StrCat("B ", b, " T ", t, " NH ", nh, " hs ", hs));
    const int64_t c = nh * hs;
    const DType h = half();
    const HalfValues inp = random_half(b * t * 3 * c, 21, h), dout = random_half(b * t * c, 22, h);
    std::vector<float> inp_c = inp.wide, dout_c = dout.wide, out(b * t * c), lse(b * nh * t), dinp(b * t * 3 * c);
    ASSERT_TRUE(attention_forward(view(out, {b, t, c}), view(lse, {b, nh, t}), view(inp_c, {b, t, 3 * c}), nh).ok());
    const HalfValues zeros_out{std::vector<uint16_t>(b * t * c), std::vector<float>(b * t * c)};
    const HalfValues zeros_dinp{std::vector<uint16_t>(b * t * 3 * c), std::vector<float>(b * t * 3 * c)};
    const Tensor g_inp = upload_as(inp, h, {b, t, 3 * c}), g_out = upload_as(zeros_out, h, {b, t, c});
    const Tensor g_lse = upload(std::vector<float>(b * nh * t), {b, nh, t});
    ASSERT_TRUE(attention_forward(g_out, g_lse, g_inp, nh).ok());
    const double ds = 2.0 * hs * kU32 * hs / std::sqrt(static_cast<double>(hs));  // as the fp32 test
    const double tol = 2 * ds + t * kU32;
    expect_result(g_out, out, tol, "out");
    expect_near_all(download<float>(g_lse), lse, tol, "lse");
    HalfValues out_h{std::vector<uint16_t>(out.size()), testing::representable(h, out)};
    for (size_t i = 0; i < out.size(); ++i) out_h.bits[i] = testing::round_to(h, out[i]);
    ASSERT_TRUE(attention_backward(view(dinp, {b, t, 3 * c}), view(dout_c, {b, t, c}), view(inp_c, {b, t, 3 * c}),
                                   view(out_h.wide, {b, t, c}), view(lse, {b, nh, t}), nh)
                    .ok());
    const Tensor g_dinp = upload_as(zeros_dinp, h, {b, t, 3 * c});
    ASSERT_TRUE(attention_backward(g_dinp, upload_as(dout, h, {b, t, c}), g_inp, upload_as(out_h, h, {b, t, c}),
                                   upload(lse, {b, nh, t}), nh)
                    .ok());
    expect_result(g_dinp, dinp, t * tol * hs, "dinp");
  }
}

#if ZERO_HAS_CUDNN
// cuDNN's fused attention against the CPU's fp32 kernels on the same (widened) numbers, called directly so a refusal
// fails rather than falls back: GPT-2 124M's heads (HS 64) at a short and at its full 1024 context. q, k, v, dout in
// [-1, 1]. Beyond the fp32 tolerances of the tiled test, cuDNN rounds to the half format (relative u each) the
// probabilities P it multiplies by v, and the score gradients dS = P (dP - D) it multiplies by k and q, besides the
// results themselves; P, D and the softmax's sums stay fp32. Per element, with |q|, |k|, |v|, |dout| <= 1, scale =
// 1/sqrt(HS), and |dP - D| <= 2 HS:
//   out_i   sum_j P_ij v_j / l_i with sum_j P_ij / l_i = 1                 <= u + u |out_i|
//   dq_i    scale sum_j dS_ij k_j, sum_j |dS_ij| <= 2 HS (a row of P sums to 1)    <= 2 u sqrt(HS) + u |dq_i|
//   dk_j    scale sum_i dS_ij q_i                                            <= 2 u sqrt(HS) c_j + u |dk_j|
//   dv_j    sum_i P_ij dout_i                                                <= u c_j + u |dv_j|
// where c_j = sum_i P_ij, key j's column of probabilities, computed here from the CPU's lse in fp64. The fp32 sums on
// either side (T keys or queries, HS products each) add at most (T + 2 HS) fp32 roundoffs of the same magnitudes.
class CudnnAttention : public CudaHalf {};

TEST_P(CudnnAttention, TakesGpt2sHeadsMatchesCpuWithinItsRoundingAndRepeatsBitwise) {
  // T = 45: no multiple of cuDNN's tiles (padded inside).
  for (const auto& [b, t, nh] : {std::tuple<int64_t, int64_t, int64_t>{2, 128, 2}, {2, 45, 3}, {1, 1024, 12}}) {
    const int64_t hs = 64, c = nh * hs;
    SCOPED_TRACE(absl::StrCat("B ", b, " T ", t, " NH ", nh, " HS ", hs));
    const DType h = half();
    const double u = half_roundoff(h), scale = 1.0 / std::sqrt(static_cast<double>(hs));
    const HalfValues inp = random_half(b * t * 3 * c, 41, h), dout = random_half(b * t * c, 42, h);
    std::vector<float> inp_c = inp.wide, dout_c = dout.wide, out(b * t * c), lse(b * nh * t), dinp(b * t * 3 * c);
    ASSERT_TRUE(attention_forward(view(out, {b, t, c}), view(lse, {b, nh, t}), view(inp_c, {b, t, 3 * c}), nh).ok());
    const Tensor g_inp = upload_as(inp, h, {b, t, 3 * c});
    const Tensor g_out = upload(std::vector<uint16_t>(b * t * c), {b, t, c});
    const Tensor g_lse = upload(std::vector<float>(b * nh * t), {b, nh, t});
    absl::StatusOr<bool> ran =
        cuda::cudnn_attention_forward(0, g_out.data(), g_lse.data_as<float>(), g_inp.data(), h, b, t, nh, hs);
    ASSERT_TRUE(ran.ok()) << ran.status();
    ASSERT_TRUE(*ran) << "cuDNN refused the shape (its reason is on stderr)";
    const double ds = 2.0 * hs * kU32 * hs * scale, tol = 2 * ds + t * kU32;  // the tiled fp32 test's
    const std::vector<uint16_t> out_bits = download<uint16_t>(Tensor(g_out.data(), h, {b, t, c}, Device::cuda(0)));
    for (size_t i = 0; i < out.size(); ++i) {
      const double got = testing::widen(h, out_bits[i]);
      ASSERT_LE(std::fabs(got - out[i]), tol + u + u * std::fabs(out[i])) << "out[" << i << "]";
    }
    expect_near_all(download<float>(g_lse), lse, tol + 8 * kU32 * 20, "lse");  // |lse| <= log T + |s| <= 20

    // Backward from the CPU's out, rounded, and lse on both sides.
    HalfValues out_h{std::vector<uint16_t>(out.size()), testing::representable(h, out)};
    for (size_t i = 0; i < out.size(); ++i) out_h.bits[i] = testing::round_to(h, out[i]);
    ASSERT_TRUE(attention_backward(view(dinp, {b, t, 3 * c}), view(dout_c, {b, t, c}), view(inp_c, {b, t, 3 * c}),
                                   view(out_h.wide, {b, t, c}), view(lse, {b, nh, t}), nh)
                    .ok());
    const Tensor g_dinp = upload(std::vector<uint16_t>(b * t * 3 * c), {b, t, 3 * c});
    const Tensor g_dout = upload_as(dout, h, {b, t, c}), g_out_h = upload_as(out_h, h, {b, t, c});
    const Tensor g_cpu_lse = upload(lse, {b, nh, t});
    const auto backward = [&] {
      absl::StatusOr<bool> r = cuda::cudnn_attention_backward(
          0, g_dinp.data(), g_dout.data(), g_inp.data(), g_out_h.data(), g_cpu_lse.data_as<float>(), h, b, t, nh, hs);
      EXPECT_TRUE(r.ok() && *r) << r.status();
      return download<uint16_t>(Tensor(g_dinp.data(), h, {b, t, 3 * c}, Device::cuda(0)));
    };
    const std::vector<uint16_t> dinp_bits = backward();
    // c_j per (batch, head, key), from the CPU's probabilities.
    std::vector<double> column(b * nh * t, 0.0);
    for (int64_t bi = 0; bi < b; ++bi) {
      for (int64_t hi = 0; hi < nh; ++hi) {
        for (int64_t i = 0; i < t; ++i) {
          const float* q = &inp_c[(bi * t + i) * 3 * c + hi * hs];
          for (int64_t j = 0; j <= i; ++j) {
            const float* k = &inp_c[(bi * t + j) * 3 * c + c + hi * hs];
            double s = 0;
            for (int64_t e = 0; e < hs; ++e) s += static_cast<double>(q[e]) * k[e];
            column[(bi * nh + hi) * t + j] += std::exp(s * scale - lse[(bi * nh + hi) * t + i]);
          }
        }
      }
    }
    const double per_magnitude = u + static_cast<double>(t + 2 * hs) * kU32;
    int misses = 0;
    for (int64_t bi = 0; bi < b; ++bi) {
      for (int64_t ti = 0; ti < t; ++ti) {
        for (int64_t part = 0; part < 3 && misses < 5; ++part) {  // q, k, v
          for (int64_t hi = 0; hi < nh; ++hi) {
            const double cj = column[(bi * nh + hi) * t + ti];
            const double magnitude = part == 0 ? 2 * std::sqrt(hs) : part == 1 ? 2 * std::sqrt(hs) * cj : cj;
            for (int64_t e = 0; e < hs; ++e) {
              const int64_t i = (bi * t + ti) * 3 * c + part * c + hi * hs + e;
              const double want = dinp[i], got = testing::widen(h, dinp_bits[i]);
              if (!(std::fabs(got - want) <= per_magnitude * magnitude + u * std::fabs(want))) {
                ADD_FAILURE() << "dinp[" << i << "] ("
                              << "qkv"[part] << "): " << got << " vs CPU " << want;
                ++misses;
              }
            }
          }
        }
      }
    }
    EXPECT_EQ(backward(), dinp_bits) << "the deterministic backward repeats its bits";
    // The kernels' API takes the same path: cuDNN's bits, forward and backward.
    const Tensor api_out = upload(std::vector<uint16_t>(b * t * c), {b, t, c});
    const Tensor api_dinp = upload(std::vector<uint16_t>(b * t * 3 * c), {b, t, 3 * c});
    const Tensor api_out_h(api_out.data(), h, {b, t, c}, Device::cuda(0));
    const Tensor api_dinp_h(api_dinp.data(), h, {b, t, 3 * c}, Device::cuda(0));
    ASSERT_TRUE(attention_forward(api_out_h, g_lse, g_inp, nh).ok());
    EXPECT_EQ(download<uint16_t>(api_out_h), out_bits);
    ASSERT_TRUE(attention_backward(api_dinp_h, g_dout, g_inp, g_out_h, g_cpu_lse, nh).ok());
    EXPECT_EQ(download<uint16_t>(api_dinp_h), dinp_bits);
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16AndFp16, CudnnAttention, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
#endif

// On aligned tensors the casts move whole chunks as vectors (common.cuh); a tensor one element into its buffer is
// read or written element by element: the CPU's bits in every pairing of the source's and destination's offsets.
TEST_F(CudaKernels, CastsEqualCpuBitwise) {
  const std::vector<float> x = cast_inputs();
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> xc = x;
  const StochasticRounding sr{.seed = 99, .step = 3, .index_offset = 1000};
  // A device tensor of n elements of `t`, `offset` elements into a buffer of offset + n holding `values` after it.
  const auto on_gpu = [&]<typename T>(const std::vector<T>& values, DType t, int64_t offset) {
    std::vector<T> shifted(offset, T{});
    shifted.insert(shifted.end(), values.begin(), values.end());
    return Tensor(static_cast<uint8_t*>(upload(shifted, {offset + n}).data()) + offset * dtype_size(t), t, {n},
                  Device::cuda(0));
  };
  for (const auto& [from, to] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {1, 1}, {0, 1}, {1, 0}}) {
    const Tensor g_x = on_gpu(x, DType::kF32, from);
    for (DType half : {DType::kBF16, DType::kF16}) {
      for (const StochasticRounding* rounding : {static_cast<const StochasticRounding*>(nullptr), &sr}) {
        const std::string what =
            absl::StrCat(dtype_name(half), rounding ? " stochastic" : " nearest", ", offsets ", from, " -> ", to);
        std::vector<uint16_t> h(n);
        const Tensor h_view(h.data(), half, {n});
        const Tensor g_h = on_gpu(std::vector<uint16_t>(n), half, to);
        ASSERT_TRUE(cast(h_view, view(xc, {n}), rounding).ok());
        ASSERT_TRUE(cast(g_h, g_x, rounding).ok());
        EXPECT_EQ(download<uint16_t>(g_h), h) << what;
        // Back to fp32 (from `to` into `from`): exact on both sides, NaN payloads included, so compare bits.
        std::vector<float> back(n);
        const Tensor g_back = on_gpu(std::vector<float>(n), DType::kF32, from);
        ASSERT_TRUE(cast(view(back, {n}), h_view).ok());
        ASSERT_TRUE(cast(g_back, g_h).ok());
        const std::vector<float> g_back_host = download<float>(g_back);
        EXPECT_EQ(std::memcmp(g_back_host.data(), back.data(), back.size() * sizeof(float)), 0) << what;
      }
    }
  }
}

// Elements of dtype t with the same bits, or both NaN: a NaN produced by GPU arithmetic is the device's canonical
// one, not the CPU's, and no caller reads NaN payloads (a NaN gradient only skips the step).
void expect_same_bits_or_both_nan(const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& cpu, DType t,
                                  const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  const size_t size = dtype_size(t);
  int64_t mismatches = 0, first = -1;
  for (size_t i = 0; i < cpu.size() / size; ++i) {
    if (std::isnan(load_as_float(gpu.data(), t, i)) && std::isnan(load_as_float(cpu.data(), t, i))) continue;
    if (std::memcmp(&gpu[i * size], &cpu[i * size], size) == 0) continue;
    if (mismatches++ == 0) first = static_cast<int64_t>(i);
  }
  if (mismatches == 0) return;
  ADD_FAILURE() << what << ": " << mismatches << " elements differ, the first at " << first << ": gpu "
                << load_as_float(gpu.data(), t, first) << ", cpu " << load_as_float(cpu.data(), t, first);
}

// The engine's buffer arithmetic on the device gives the CPU's bits in every floating dtype, specials included.
TEST_F(CudaKernels, BufferMathEqualsCpuBitwise) {
  const std::vector<float> a = cast_inputs();
  const int64_t n = static_cast<int64_t>(a.size());
  const std::vector<float> b = random_floats(n, 26, -70000.0f, 70000.0f);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t nbytes = n * static_cast<int64_t>(dtype_size(t));
    std::vector<uint8_t> x(nbytes), y(nbytes);
    for (int64_t i = 0; i < n; ++i) {
      store_from_float(x.data(), t, i, a[i]);
      store_from_float(y.data(), t, i, b[i]);
    }
    const Tensor cpu_x(x.data(), t, {n}), cpu_y(y.data(), t, {n});
    const Tensor gpu_x(upload(x, {nbytes}).data(), t, {n}, Device::cuda(0));
    const Tensor gpu_y(upload(y, {nbytes}).data(), t, {n}, Device::cuda(0));
    const auto expect_same = [&](const char* after) {
      const std::vector<uint8_t> gpu = download<uint8_t>(Tensor(gpu_x.data(), DType::kU8, {nbytes}, Device::cuda(0)));
      expect_same_bits_or_both_nan(gpu, x, t, absl::StrCat(dtype_name(t), " ", after));
    };
    ASSERT_TRUE(add_into(cpu_x, cpu_y).ok() && add_into(gpu_x, gpu_y).ok());
    expect_same("add_into");
    ASSERT_TRUE(divide_by(cpu_x, 3.0f).ok() && divide_by(gpu_x, 3.0f).ok());
    expect_same("divide_by");
    ASSERT_TRUE(fill_zero(cpu_x).ok() && fill_zero(gpu_x).ok());
    expect_same("fill_zero");
  }
}

// The chunked kernels (common.cuh) move a whole chunk at an aligned address as vectors and anything else element by
// element, with the same arithmetic: every kernel below, run on tensors that start one element into their buffers
// (no chunk aligned), gives the bits of the run on aligned ones. The flat length ends in a partial chunk; the rows
// of LayerNorm and of the logits are whole chunks, so the aligned run moves vectors throughout, the logits' padding
// included.
TEST_F(CudaKernels, ChunkedKernelsGiveTheSameBitsOnAlignedAndMisalignedTensors) {
  const int64_t n = 8 * 125 + 5, rows = 7, c = 200, padded = 136, vocab = 130;
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = r == 3 ? kIgnoreIndex : static_cast<int32_t>((r * 37) % vocab);
  const Tensor g_targets = upload(targets, {rows});
  const char* names[] = {"gelu out",       "gelu dinp",     "residual", "add_into", "divide_by",
                         "inp + residual", "layernorm out", "mean",     "rstd",     "layernorm dinp",
                         "dweight",        "dbias",         "dlogits"};
  for (const DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    // Every tensor after one run, as bytes; each starts `offset` elements into its buffer.
    const auto run = [&](int64_t offset) {
      const auto put = [&](const std::vector<float>& values, const Shape& shape) {
        std::vector<float> shifted(offset, 0.0f);
        shifted.insert(shifted.end(), values.begin(), values.end());
        const std::vector<uint8_t> bytes = bytes_in(t, shifted);
        const Tensor buffer = upload(bytes, {static_cast<int64_t>(bytes.size())});
        return Tensor(static_cast<uint8_t*>(buffer.data()) + offset * dtype_size(t), t, shape, Device::cuda(0));
      };
      const Tensor x = put(random_floats(n, 40, -5, 5), {n}), y = put(random_floats(n, 41), {n});
      const Tensor gelu_out = put(std::vector<float>(n), {n}), gelu_dinp = put(std::vector<float>(n), {n});
      const Tensor sum = put(std::vector<float>(n), {n});
      const Tensor ln_inp = put(random_floats(rows * c, 42), {rows, c}),
                   res = put(random_floats(rows * c, 43), {rows, c});
      const Tensor w = put(random_floats(c, 44), {c}), b = put(random_floats(c, 45), {c});
      const Tensor ln_out = put(std::vector<float>(rows * c), {rows, c});
      const Tensor ln_dout = put(random_floats(rows * c, 47), {rows, c}),
                   dres = put(random_floats(rows * c, 48), {rows, c});
      const Tensor ln_dinp = put(std::vector<float>(rows * c), {rows, c});
      const Tensor dw = put(random_floats(c, 49), {c}), db = put(random_floats(c, 50), {c});
      const Tensor mean = upload(std::vector<float>(rows), {rows}), rstd = upload(std::vector<float>(rows), {rows});
      const Tensor logits = put(random_floats(rows * padded, 46, -4, 4), {rows, padded});
      absl::Status s = gelu_forward(gelu_out, x);
      s.Update(gelu_backward(gelu_dinp, x, y));
      s.Update(residual_forward(sum, x, y));
      s.Update(add_into(x, y));
      s.Update(divide_by(y, 3.0f));
      s.Update(residual_layernorm_forward(ln_out, mean, rstd, ln_inp, res, w, b));
      s.Update(layernorm_backward(ln_dinp, dw, db, ln_dout, ln_inp, w, mean, rstd, dres));
      s.Update(crossentropy_forward_backward(logits, logits, g_targets, vocab).status());
      EXPECT_TRUE(s.ok()) << s;
      std::vector<std::vector<uint8_t>> results;
      for (const Tensor& r : {gelu_out, gelu_dinp, sum, x, y, ln_inp, ln_out, mean, rstd, ln_dinp, dw, db, logits}) {
        results.push_back(
            download<uint8_t>(Tensor(r.data(), DType::kU8, {static_cast<int64_t>(r.nbytes())}, Device::cuda(0))));
      }
      return results;
    };
    const auto aligned = run(0), misaligned = run(1);
    for (size_t i = 0; i < aligned.size(); ++i) {
      EXPECT_EQ(misaligned[i], aligned[i]) << dtype_name(t) << " " << names[i];
    }
  }
}

// Runs in every build: arguments on two devices are refused before any data is touched.
TEST(CudaKernelChecks, MixedDevicesAreRefused) {
  std::vector<float> x(8), y(8);
  const Tensor on_gpu(y.data(), DType::kF32, {8}, Device::cuda(0));
  const absl::Status s = gelu_forward(on_gpu, view(x, {8}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(CudaKernelChecks, CudaTensorsWithoutCudaBuildAreRefused) {
#if ZERO_HAS_CUDA
  GTEST_SKIP() << "built with CUDA";
#endif
  std::vector<float> x(4);
  const Tensor on_gpu(x.data(), DType::kF32, {2, 2}, Device::cuda(0));
  const absl::Status s = matmul_forward(on_gpu, on_gpu, on_gpu, Tensor());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("without CUDA"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace zero::kernels
