// GPT-2 and the MLP run on cuda:0 against the same run on the CPU; every test skips without a CUDA device.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "models/gpt2.h"
#include "models/gpt2_weights.h"
#include "models/mlp.h"
#include "runtime/safetensors.h"
#include "runtime/status.h"
#include "tests/models/compare.h"
#include "tests/models/gpt2_fixture.h"
#include "tests/models/half_bounds.h"
#include "tests/models/half_checks.h"
#include "tests/models/model_runner.h"
#include "tests/skip_without_gpu.h"

namespace zero {
namespace {

using testing::max_relative_error;
using testing::ModelRunner;
using testing::ParamFill;
using testing::RunResult;

// The CPU and CUDA kernels sum in different orders (tests/kernels/cuda_kernels_test.cc bounds each kernel
// alone), so the runs agree only to fp32 rounding. The PyTorch comparisons (gpt2_test.cc, mlp_test.cc) put
// each fp32 run within kFp32Tolerance of the fp64 result, as a fraction of each tensor's largest element
// (largest seen: 6.5e-7), by an argument that holds for any summation order: typical sums of n terms are off
// by ~sqrt(n)·2^-24, chained over ~20 steps. Two such runs are within twice that of each other. (The
// per-kernel worst cases, e.g. 2·K²·2^-24 ~ 2e-3 for a K = 128 GEMM, are far looser than what happens.)
constexpr double kFp32Tolerance = 1e-5;
constexpr double kCpuVsCudaTolerance = 2 * kFp32Tolerance;

// A model built twice, one runner on the CPU and one on cuda:0, with the same parameters.
struct CpuAndCuda {
  std::unique_ptr<Model> cpu_model, cuda_model;
  std::unique_ptr<ModelRunner> cpu, cuda;
};

CpuAndCuda make_runners(const std::function<std::unique_ptr<Model>()>& create, DType dtype, const ParamFill& fill) {
  CpuAndCuda r{.cpu_model = create(), .cuda_model = create()};
  r.cpu = std::make_unique<ModelRunner>(*r.cpu_model, dtype);
  r.cuda = std::make_unique<ModelRunner>(*r.cuda_model, dtype, Device::cuda(0));
  for (ModelRunner* runner : {r.cpu.get(), r.cuda.get()}) {
    const absl::Status s = runner->load(fill);
    EXPECT_TRUE(s.ok()) << s;
  }
  return r;
}

// How far the CUDA run may be from the CPU's, as a fraction of each tensor's largest element.
struct Tolerance {
  double forward;    // the logits
  double gradients;  // every parameter gradient
};

// fp32: both runs within kFp32Tolerance of the exact result. bf16/fp16 with the same parameters on both sides: a
// rounding the runs share is no difference, but where their fp32 results straddle a rounding boundary they round to
// neighbours, at most u apart, and what follows sees that as a rounding of its own; cuDNN's attention rounds inside
// where the CPU does not. So no more than the bound for every rounding (tests/models/half_bounds.h counts cuDNN's),
// without the parameters'.
Tolerance cpu_vs_cuda(DType dtype, const testing::Roundings& roundings) {
  if (dtype == DType::kF32) return {kCpuVsCudaTolerance, kCpuVsCudaTolerance};
  return {testing::forward_bound(dtype, roundings, kCpuVsCudaTolerance),
          testing::gradient_bound(dtype, roundings, kCpuVsCudaTolerance)};
}

// Rows of logits (rows, stride) whose two largest of the first `classes` lie within `margin` of each other: where
// the argmax may differ between two runs whose logits differ by less than margin / 2.
int64_t close_calls(const std::vector<float>& logits, int64_t stride, int64_t classes, double margin) {
  int64_t close = 0;
  for (size_t row = 0; row < logits.size(); row += stride) {
    std::vector<float> top(logits.begin() + row, logits.begin() + row + classes);
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<>());
    close += top[0] - top[1] < margin;
  }
  return close;
}

// One forward and backward on each device from the same host batch: the same predictions, the logits and every
// gradient within `tolerance`, the loss within what those logits allow, the argmax hits equal but for rows too close
// to call, and the device's memory all returned. `classes`: the logits' real columns.
void expect_cuda_matches_cpu(CpuAndCuda& r, const Batch& batch, float loss_scale, Tolerance tolerance,
                             int64_t classes) {
  Allocator cpu_alloc, cuda_alloc;
  const absl::StatusOr<RunResult> cpu = r.cpu->forward_backward(cpu_alloc, batch, loss_scale);
  const absl::StatusOr<RunResult> cuda = r.cuda->forward_backward(cuda_alloc, batch, loss_scale);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->predictions, cpu->predictions);
  ASSERT_EQ(cuda->logits_shape, cpu->logits_shape);
  EXPECT_LT(max_relative_error(cuda->logits, cpu->logits), tolerance.forward);
  double max_logit = 0;
  for (float z : cpu->logits) max_logit = std::max(max_logit, std::fabs(static_cast<double>(z)));
  const double logit_error = tolerance.forward * max_logit;
  // Cross-entropy's gradient in the logits, p - onehot, has |.|_1 <= 2 per row: the mean loss moves by at most
  // twice the largest logit change.
  EXPECT_NEAR(cuda->loss, cpu->loss, 2 * logit_error);
  const int64_t close = close_calls(cpu->logits, cpu->logits_shape.back(), classes, 2 * logit_error);
  EXPECT_LE(std::abs(cuda->correct - cpu->correct), close);
  int checked = 0;
  r.cpu->for_each_param([&](const std::string& unit, const std::string& param) {
    const std::vector<float> want = testing::values(r.cpu->grad(unit, param));
    const std::vector<float> got = testing::values(r.cuda->grad(unit, param));
    EXPECT_LT(max_relative_error(got, want), tolerance.gradients) << unit << "." << param;
    ++checked;
  });
  EXPECT_GT(checked, 0);
  EXPECT_EQ(cuda_alloc.stats().current_total, 0) << cuda_alloc.summary();
}

// ---- GPT-2 ----

Gpt2Config tiny() { return *Gpt2Config::preset("tiny"); }

CpuAndCuda gpt2_runners(DType dtype, const Gpt2HfReader& reader) {
  return make_runners([] { return std::unique_ptr<Model>(*Gpt2::create(tiny())); }, dtype,
                      [&](absl::string_view unit, absl::string_view param, const Tensor& dst) {
                        return reader.fill(unit, param, dst);
                      });
}

// Both runs compute in the parameters' dtype from the same values.
class CudaGpt2 : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_GPU(); }
};

TEST_P(CudaGpt2, MatchesCpu) {
  const DType dtype = GetParam();
  const testing::Gpt2FixtureBatch f = testing::load_gpt2_fixture_batch();
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(testing::kGpt2TinyWeights, tiny());
  ASSERT_TRUE(reader.ok()) << reader.status();
  CpuAndCuda r = gpt2_runners(dtype, *reader);
  expect_cuda_matches_cpu(r, f.batch, testing::loss_scale_for(dtype),
                          cpu_vs_cuda(dtype, testing::gpt2_roundings(static_cast<int>(tiny().num_layers), false)),
                          tiny().vocab_size);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaGpt2, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The bound above is loose for a half run (every rounding counted, where the runs differ at few): the GPU's bf16/fp16
// run is also held to PyTorch's fp64 fixture within the bound the CPU's run meets (mixed_precision_test.cc).
class CudaGpt2Half : public CudaGpt2 {};

TEST_P(CudaGpt2Half, MatchesPyTorchWithinTheCpusBound) {
  const DType half = GetParam();
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(testing::kGpt2TinyWeights, tiny());
  ASSERT_TRUE(reader.ok()) << reader.status();
  CpuAndCuda r = gpt2_runners(half, *reader);
  testing::expect_gpt2_matches_pytorch(*r.cuda, half, testing::loss_scale_for(half), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(HalfFormats, CudaGpt2Half, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- MLP ----

const std::vector<int64_t> kMlpWidths = {16, 32, 32, 10};

struct MlpFixture {
  SafetensorsFile file;
  Batch batch;  // inputs (8, 16), targets (8)
};

MlpFixture load_mlp_fixture() {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(ZERO_FIXTURES_DIR "/mlp.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  MlpFixture f{.file = *std::move(file)};
  f.batch = {.inputs = *f.file.get("inputs"), .targets = *f.file.get("targets")};
  return f;
}

CpuAndCuda mlp_runners(const SafetensorsFile& file, DType dtype) {
  return make_runners([] { return std::unique_ptr<Model>(*Mlp::create(kMlpWidths)); }, dtype,
                      [&](absl::string_view unit, absl::string_view param, const Tensor& dst) {
                        ZERO_ASSIGN_OR_RETURN(Tensor src,
                                              file.get(absl::StrCat(unit, ".", param), DType::kF32, dst.shape()));
                        std::copy_n(src.data_as<float>(), src.numel(), dst.data_as<float>());
                        return absl::OkStatus();
                      });
}

class CudaMlp : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_GPU(); }
};

// The loss scale multiplies the loss's gradient before its one rounding, on both sides; a power of two scales every
// result exactly, so the relative tolerances hold with or without it.
TEST_P(CudaMlp, MatchesCpuWithAndWithoutALossScale) {
  const DType dtype = GetParam();
  const MlpFixture f = load_mlp_fixture();
  const Tolerance tolerance =
      cpu_vs_cuda(dtype, testing::mlp_roundings(static_cast<int>(kMlpWidths.size()) - 1, false));
  for (const float loss_scale : {1.0f, 1024.0f}) {
    SCOPED_TRACE(absl::StrCat("loss scale ", loss_scale));
    CpuAndCuda r = mlp_runners(f.file, dtype);
    expect_cuda_matches_cpu(r, f.batch, loss_scale, tolerance, kMlpWidths.back());
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaMlp, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace zero
