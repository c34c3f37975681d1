// The fused CUDA kernels give bitwise the CPU loops' parameters, state and half copies.
#include <cuda_runtime.h>

#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optim/optimizers.h"
#include "optim/square_sum.h"
#include "runtime/comm/local.h"
#include "runtime/status.h"
#include "tests/skip_without_gpu.h"

namespace zero {
namespace {

using Factory = std::function<absl::StatusOr<std::unique_ptr<Optimizer>>(ShardLayout, Allocator&, Device)>;

constexpr int kRanks = 3;
constexpr int64_t kFlat = 300000;
constexpr int64_t kShard = kFlat / kRanks;
constexpr int kSteps = 3;

struct Trajectory {
  std::vector<float> params;
  std::vector<uint16_t> half;
};

// Parameters that straddle ranks (LAMB/LARS norms need the allreduce) and span several 2^16-element chunks,
// 60 small ones (more segments than one kernel launch takes), a gap, and two groups.
std::vector<FlatParam> test_params() {
  std::vector<FlatParam> params = {{"a.weight", 0, 150000}, {"a.bias", 150000, 30}};
  int64_t offset = 150040;
  for (int i = 0; i < 60; ++i, offset += 100) params.push_back({absl::StrCat("h", i, ".weight"), offset, 100});
  params.push_back({"b.weight", offset, kFlat - offset});
  return params;
}

std::vector<float> normal_vector(int64_t n, unsigned seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = scale * dist(gen);
  return v;
}

// One rank's shard on `device`: kSteps steps with its communicator, bf16 stochastic copy; writes its slices.
absl::Status run_rank(const Factory& make, Device device, Communicator& comm, Trajectory& out) {
  std::vector<FlatParam> params = test_params();
  std::vector<ParamGroup> groups = assign_decay_groups(params, 0.05f);
  groups[1].lr_scale = 0.25f;
  ZERO_ASSIGN_OR_RETURN(ShardLayout layout, ShardLayout::for_rank(params, groups, kFlat, comm.rank(), kRanks));
  Allocator allocator(comm.rank());
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, make(std::move(layout), allocator, device));
  ZERO_ASSIGN_OR_RETURN(Buffer p, allocator.allocate(kShard * 4, MemoryCategory::kParams, device));
  ZERO_ASSIGN_OR_RETURN(Buffer g, allocator.allocate(kShard * 4, MemoryCategory::kGrads, device));
  ZERO_ASSIGN_OR_RETURN(Buffer h, allocator.allocate(kShard * 2, MemoryCategory::kParams, device));
  const std::vector<uint16_t> zeros(kShard);  // the gap between a.bias and h0 is never written, and is compared
  cudaMemcpy(h.data(), zeros.data(), kShard * 2, cudaMemcpyDefault);
  const int64_t begin = comm.rank() * kShard;
  cudaMemcpy(p.data(), out.params.data() + begin, kShard * 4, cudaMemcpyDefault);
  for (int t = 1; t <= kSteps; ++t) {
    const std::vector<float> grads = normal_vector(kFlat, 100 + t, 0.1f);
    cudaMemcpy(g.data(), grads.data() + begin, kShard * 4, cudaMemcpyDefault);
    HalfCopy half{h.tensor(DType::kBF16, {kShard}), /*stochastic=*/true, /*seed=*/9};
    ZERO_RETURN_IF_ERROR(
        opt->step(p.tensor(DType::kF32, {kShard}), g.tensor(DType::kF32, {kShard}), t, 0.01f, &comm, half));
  }
  cudaMemcpy(out.params.data() + begin, p.data(), kShard * 4, cudaMemcpyDefault);
  cudaMemcpy(out.half.data() + begin, h.data(), kShard * 2, cudaMemcpyDefault);
  return absl::OkStatus();
}

Trajectory run(const Factory& make, Device device) {
  Trajectory out{normal_vector(kFlat, 5, 1.0f), std::vector<uint16_t>(kFlat)};
  std::vector<absl::Status> statuses =
      run_local_ranks(kRanks, [&](Communicator& comm) { return run_rank(make, device, comm, out); });
  EXPECT_TRUE(root_cause(statuses).ok()) << root_cause(statuses);
  return out;
}

struct OptimizerCase {
  const char* name;  // the test's name suffix
  Factory make;
};

class CudaMatchesCpu : public ::testing::TestWithParam<OptimizerCase> {};

// Bitwise: the kernels call the CPU's element functions (element_math.h), both sides are built without FMA
// contraction (-ffp-contract=off, --fmad=false) with IEEE division and sqrt, and the LAMB/LARS norms come from
// the same exact integer square sums (square_sum.h) whatever the order of the device's atomics.
TEST_P(CudaMatchesCpu, Bitwise) {
  ZERO_SKIP_WITHOUT_GPU();
  const Trajectory cpu = run(GetParam().make, Device::cpu());
  const Trajectory gpu = run(GetParam().make, Device::cuda(0));
  EXPECT_EQ(std::memcmp(cpu.params.data(), gpu.params.data(), cpu.params.size() * 4), 0);
  EXPECT_EQ(std::memcmp(cpu.half.data(), gpu.half.data(), cpu.half.size() * 2), 0);
}

// The engine's gradient norm on the device: the same exact integers as the CPU's chunked bins, in every dtype.
TEST(ExactSquareSumCuda, EqualsCpuBitwise) {
  ZERO_SKIP_WITHOUT_GPU();
  // Over 512 chunks, so the device bins take more than one round trip; specials at the end.
  std::vector<float> values = normal_vector(513 * SquareBins::kMaxBinnedValues + 77, 9, 1e3f);
  values.back() = std::numeric_limits<float>::denorm_min();
  const int64_t n = static_cast<int64_t>(values.size());
  Allocator allocator;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<uint8_t> bytes(n * dtype_size(t));
    for (int64_t i = 0; i < n; ++i) store_from_float(bytes.data(), t, i, values[i]);
    absl::StatusOr<Buffer> device =
        allocator.allocate(static_cast<int64_t>(bytes.size()), MemoryCategory::kWorkspace, Device::cuda(0));
    ASSERT_TRUE(device.ok()) << device.status();
    ASSERT_EQ(cudaMemcpy(device->data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    for (float divisor : {1.0f, 3.0f}) {
      absl::StatusOr<SquareSum> cpu = exact_square_sum(Tensor(bytes.data(), t, {n}), divisor);
      absl::StatusOr<SquareSum> gpu = exact_square_sum(device->tensor(t, {n}), divisor);
      ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
      std::vector<int32_t> cpu_wire(SquareSum::kWireInts), gpu_wire(SquareSum::kWireInts);
      cpu->to_wire(cpu_wire.data());
      gpu->to_wire(gpu_wire.data());
      EXPECT_EQ(gpu_wire, cpu_wire) << t << " / " << divisor;
    }
    values[n / 2] = std::numeric_limits<float>::infinity();  // the next dtype also checks the flags
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, CudaMatchesCpu,
    ::testing::Values(
        OptimizerCase{"SgdNesterov",
                      [](ShardLayout l, Allocator& a, Device d) {
                        return make_sgd({.momentum = 0.9, .nesterov = true}, std::move(l), a, d);
                      }},
        OptimizerCase{"Adam", [](ShardLayout l, Allocator& a, Device d) { return make_adam({}, std::move(l), a, d); }},
        OptimizerCase{"Lamb", [](ShardLayout l, Allocator& a, Device d) { return make_lamb({}, std::move(l), a, d); }},
        OptimizerCase{"Lars", [](ShardLayout l, Allocator& a,
                                 Device d) { return make_lars({.trust_coefficient = 0.02}, std::move(l), a, d); }}),
    [](const ::testing::TestParamInfo<OptimizerCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zero
