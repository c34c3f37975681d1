// The fused CUDA kernels give bitwise the CPU loops' parameters, state and half copies.
#include <cuda_runtime.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "optim/optimizers.h"

namespace zero {
namespace {

using Factory = std::function<absl::StatusOr<std::unique_ptr<Optimizer>>(ShardLayout, Allocator&, Device)>;

struct Trajectory {
  std::vector<float> params;
  std::vector<uint16_t> half;
};

// Shard [50, 250) of a 300-element flat buffer with two groups and a gap; 3 steps; bf16 stochastic copy.
Trajectory run(const Factory& make, Device device) {
  std::vector<FlatParam> params = {{"a.weight", 0, 120}, {"a.bias", 120, 30}, {"b.weight", 160, 140}};
  std::vector<ParamGroup> groups = assign_decay_groups(params, 0.05f);
  groups[1].lr_scale = 0.25f;
  const int64_t n = 200;
  std::mt19937 gen(5);
  std::normal_distribution<float> dist;
  Trajectory out{std::vector<float>(n), std::vector<uint16_t>(n)};
  for (float& x : out.params) x = dist(gen);
  Allocator allocator;
  auto opt = make(*ShardLayout::create(params, groups, 50, 250), allocator, device);
  EXPECT_TRUE(opt.ok()) << opt.status();
  auto p = *allocator.allocate(n * 4, MemoryCategory::kParams, device);
  auto g = *allocator.allocate(n * 4, MemoryCategory::kGrads, device);
  auto h = *allocator.allocate(n * 2, MemoryCategory::kParams, device);
  const cudaMemcpyKind up = device.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost;
  const cudaMemcpyKind down = device.is_cuda() ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
  cudaMemcpy(p.data(), out.params.data(), n * 4, up);
  for (int t = 1; t <= 3; ++t) {
    std::vector<float> grads(n);
    for (float& x : grads) x = 0.1f * dist(gen);
    cudaMemcpy(g.data(), grads.data(), n * 4, up);
    HalfCopy half{h.tensor(DType::kBF16, {n}), /*stochastic=*/true, /*seed=*/9};
    EXPECT_TRUE((*opt)->step(p.tensor(DType::kF32, {n}), g.tensor(DType::kF32, {n}), t, 0.01f, nullptr, half).ok());
  }
  cudaMemcpy(out.params.data(), p.data(), n * 4, down);
  cudaMemcpy(out.half.data(), h.data(), n * 2, down);
  return out;
}

class CudaMatchesCpu : public ::testing::TestWithParam<Factory> {};

TEST_P(CudaMatchesCpu, Bitwise) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  const Trajectory cpu = run(GetParam(), Device::cpu());
  const Trajectory gpu = run(GetParam(), Device::cuda(0));
  EXPECT_EQ(std::memcmp(cpu.params.data(), gpu.params.data(), cpu.params.size() * 4), 0);
  EXPECT_EQ(std::memcmp(cpu.half.data(), gpu.half.data(), cpu.half.size() * 2), 0);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CudaMatchesCpu,
                         ::testing::Values(
                             [](ShardLayout l, Allocator& a, Device d) {
                               return make_sgd({.momentum = 0.9, .nesterov = true}, std::move(l), a, d);
                             },
                             [](ShardLayout l, Allocator& a, Device d) { return make_adam({}, std::move(l), a, d); }));

}  // namespace
}  // namespace zero
