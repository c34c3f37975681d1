// DeviceBatch: a host batch uploaded to the device without the host waiting, with the host batch kept beside it.
#include "models/data/device_batch.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/device_memory.h"
#include "runtime/sim/sim_api.h"

namespace zero::data {
namespace {

constexpr Device kSim = Device::sim(0);

std::vector<int32_t> on_host(const Tensor& t) {
  std::vector<int32_t> values(static_cast<size_t>(t.numel()));
  EXPECT_TRUE(copy_bytes(values.data(), Device::cpu(), t.data(), t.device(), t.nbytes()).ok());
  return values;
}

TEST(DeviceBatch, UploadsWithoutWaitingAndKeepsTheHostBatch) {
  Allocator allocator;
  DeviceBatch device_batch(allocator, kSim);
  for (int32_t first : {0, 100}) {  // the second batch refills the same buffer
    std::vector<int32_t> inputs = {first, first + 1, first + 2, first + 3, first + 4, first + 5};
    std::vector<int32_t> targets = {first + 7, first + 8, first + 9};
    const Batch host{.inputs = Tensor(inputs.data(), DType::kI32, {2, 3}),
                     .targets = Tensor(targets.data(), DType::kI32, {3})};
    const uint64_t waits = sim_device().host_synchronizations();
    absl::StatusOr<Batch> placed = device_batch.place(host);
    ASSERT_TRUE(placed.ok()) << placed.status();
    EXPECT_EQ(sim_device().host_synchronizations(), waits) << "placing waited for the device";
    EXPECT_EQ(placed->inputs.device(), kSim);
    EXPECT_EQ(placed->inputs.shape(), Shape({2, 3}));
    EXPECT_EQ(placed->host_inputs.data(), inputs.data());
    EXPECT_EQ(placed->host_targets.data(), targets.data());
    const std::vector<int32_t> expected_inputs = inputs, expected_targets = targets;
    inputs.assign(inputs.size(), -1);  // the host batch may change once placed
    EXPECT_EQ(on_host(placed->inputs), expected_inputs);
    EXPECT_EQ(on_host(placed->targets), expected_targets);
  }
}

TEST(DeviceBatch, OnTheCpuTheBatchIsTheHostBatch) {
  Allocator allocator;
  DeviceBatch device_batch(allocator, Device::cpu());
  std::vector<int32_t> inputs = {1, 2}, targets = {3};
  const Batch host{.inputs = Tensor(inputs.data(), DType::kI32, {1, 2}),
                   .targets = Tensor(targets.data(), DType::kI32, {1})};
  absl::StatusOr<Batch> placed = device_batch.place(host);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->inputs.data(), inputs.data());
  EXPECT_EQ(placed->targets.data(), targets.data());
}

}  // namespace
}  // namespace zero::data
