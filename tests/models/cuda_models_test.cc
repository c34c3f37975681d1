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

// A gradient in whatever dtype the runner holds, widened to fp32.
std::vector<float> widened(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = load_as_float(t.data(), t.dtype(), i);
  return out;
}

// One forward and backward on each device from the same host batch: the same predictions, the loss, logits
// and every gradient within their tolerances, and the device's memory all returned.
void expect_cuda_matches_cpu(CpuAndCuda& r, const Batch& batch, float loss_scale, double grad_tolerance) {
  Allocator cpu_alloc, cuda_alloc;
  const absl::StatusOr<RunResult> cpu = r.cpu->forward_backward(cpu_alloc, batch, loss_scale);
  const absl::StatusOr<RunResult> cuda = r.cuda->forward_backward(cuda_alloc, batch, loss_scale);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->predictions, cpu->predictions);
  // Argmax hits agree unless a row's top two logits lie within the tolerance: in the fixtures they are at
  // least 1% of the largest logit apart.
  EXPECT_EQ(cuda->correct, cpu->correct);
  EXPECT_NEAR(cuda->loss, cpu->loss, kCpuVsCudaTolerance * std::fabs(cpu->loss));
  ASSERT_EQ(cuda->logits_shape, cpu->logits_shape);
  EXPECT_LT(max_relative_error(cuda->logits, cpu->logits), kCpuVsCudaTolerance);
  int checked = 0;
  r.cpu->for_each_param([&](const std::string& unit, const std::string& param) {
    const std::vector<float> want = widened(r.cpu->grad(unit, param)), got = widened(r.cuda->grad(unit, param));
    EXPECT_LT(max_relative_error(got, want), grad_tolerance) << unit << "." << param;
    ++checked;
  });
  EXPECT_GT(checked, 0);
  EXPECT_EQ(cuda_alloc.stats().current_total, 0) << cuda_alloc.summary();
}

class CudaModels : public ::testing::Test {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_GPU(); }
};

// ---- GPT-2 ----

Gpt2Config tiny() { return *Gpt2Config::preset("tiny"); }

CpuAndCuda gpt2_runners(DType dtype, const Gpt2HfReader& reader) {
  return make_runners([] { return std::unique_ptr<Model>(*Gpt2::create(tiny())); }, dtype,
                      [&](absl::string_view unit, absl::string_view param, const Tensor& dst) {
                        return reader.fill(unit, param, dst);
                      });
}

TEST_F(CudaModels, Gpt2MatchesCpu) {
  const testing::Gpt2FixtureBatch f = testing::load_gpt2_fixture_batch();
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(testing::kGpt2TinyWeights, tiny());
  ASSERT_TRUE(reader.ok()) << reader.status();
  CpuAndCuda r = gpt2_runners(DType::kF32, *reader);
  expect_cuda_matches_cpu(r, f.batch, 1.0f, kCpuVsCudaTolerance);
}

// bf16 parameters and gradients: the units widen them on the device and round the gradients back there
// (Fp32Views through kernels::cast). Both runs compute in fp32 from the same bf16 values, so only each
// gradient's final rounding to bf16 can differ: values within the fp32 tolerance may round to neighbours one
// bf16 ulp (at most 2^-7 of the element) apart, and wte, which the head and the embedding both add to,
// rounds twice: 2 ulps of the largest element, plus the fp32 tolerance.
TEST_F(CudaModels, Gpt2Bf16MatchesCpu) {
  const testing::Gpt2FixtureBatch f = testing::load_gpt2_fixture_batch();
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(testing::kGpt2TinyWeights, tiny());
  ASSERT_TRUE(reader.ok()) << reader.status();
  CpuAndCuda r = gpt2_runners(DType::kBF16, *reader);
  expect_cuda_matches_cpu(r, f.batch, 1.0f, 2 * std::ldexp(1.0, -7) + kCpuVsCudaTolerance);
}

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

CpuAndCuda mlp_runners(const SafetensorsFile& file) {
  return make_runners([] { return std::unique_ptr<Model>(*Mlp::create(kMlpWidths)); }, DType::kF32,
                      [&](absl::string_view unit, absl::string_view param, const Tensor& dst) {
                        ZERO_ASSIGN_OR_RETURN(Tensor src,
                                              file.get(absl::StrCat(unit, ".", param), DType::kF32, dst.shape()));
                        std::copy_n(src.data_as<float>(), src.numel(), dst.data_as<float>());
                        return absl::OkStatus();
                      });
}

TEST_F(CudaModels, MlpMatchesCpu) {
  const MlpFixture f = load_mlp_fixture();
  CpuAndCuda r = mlp_runners(f.file);
  expect_cuda_matches_cpu(r, f.batch, 1.0f, kCpuVsCudaTolerance);
}

// The loss scale multiplies the loss's gradient on the device (kernels::multiply_by); a power of two scales
// every result exactly on both sides, so the relative tolerance is unchanged.
TEST_F(CudaModels, MlpWithLossScaleMatchesCpu) {
  const MlpFixture f = load_mlp_fixture();
  CpuAndCuda r = mlp_runners(f.file);
  expect_cuda_matches_cpu(r, f.batch, 1024.0f, kCpuVsCudaTolerance);
}

}  // namespace
}  // namespace zero
