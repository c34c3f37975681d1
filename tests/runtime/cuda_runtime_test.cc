// CUDA devices: why one is missing, and device memory through the accounting allocator. GPU tests skip without a GPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/allocator.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"
#include "tests/skip_without_gpu.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(CudaRuntimeTest, StreamOnADeviceThatIsNotThereIsAnError) {
  const int missing = cuda_device_count();
  CudaApi api;
  auto stream = OwnedStream::create(api, missing);
  ASSERT_FALSE(stream.ok());
  EXPECT_THAT(stream.status().message(), HasSubstr(absl::StrCat("cudaSetDevice(", missing, ")")));
}

// CUDA reports a missing driver as cudaErrorInsufficientDriver, as it does an old one: the message must not.
TEST(CudaRuntimeTest, WithoutADriverTheReasonSaysSoAndNamesTheCudaToInstall) {
  int driver = 0;
  ASSERT_EQ(cudaDriverGetVersion(&driver), cudaSuccess);
  if (driver != 0) GTEST_SKIP() << "a CUDA driver is loaded";
  EXPECT_THAT(why_no_cuda_device(), AllOf(StartsWith("no CUDA GPU or driver found (cudaGetDeviceCount: "),
                                          HasSubstr(absl::StrCat("a driver for CUDA ", CUDART_VERSION / 1000, "."))));
}

TEST(CudaRuntimeTest, CheckingADeviceThatIsNotThereFailsSayingWhy) {
  const int missing = cuda_device_count();
  const absl::Status status = check_cuda_device(missing);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  if (missing == 0) {
    EXPECT_EQ(status.message(), why_no_cuda_device());
  } else {
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("cuda:", missing, " is not there")));
  }
}

TEST(CudaRuntimeTest, AllocationOnADeviceThatIsNotThereFailsWithoutKeepingAccounting) {
  Allocator allocator;
  auto buffer = allocator.allocate(1024, MemoryCategory::kParams, Device::cuda(cuda_device_count()));
  ASSERT_FALSE(buffer.ok());
  EXPECT_FALSE(is_out_of_memory(buffer.status())) << buffer.status();
  EXPECT_EQ(allocator.stats().current_total, 0);
}

TEST(CudaRuntimeTest, BudgetBreachOnCudaIsTheSameOutOfMemoryAsOnCpu) {
  Allocator on_cpu(/*rank=*/2, /*budget_bytes=*/1 << 20);
  Allocator on_cuda(/*rank=*/2, /*budget_bytes=*/1 << 20, DeviceType::kCuda);
  auto cpu = on_cpu.allocate(2 << 20, MemoryCategory::kGrads, Device::cpu());
  auto cuda = on_cuda.allocate(2 << 20, MemoryCategory::kGrads, Device::cuda(0));
  ASSERT_TRUE(is_out_of_memory(cuda.status())) << cuda.status();
  EXPECT_EQ(cuda.status(), cpu.status());
}

TEST(CudaRuntimeTest, AllocatesOnCuda0AndAccountsEveryByte) {
  ZERO_SKIP_WITHOUT_GPU();
  Allocator allocator(/*rank=*/0, /*budget_bytes=*/3 << 20, DeviceType::kCuda);
  auto params = allocator.allocate(1 << 20, MemoryCategory::kParams, Device::cuda(0));
  ASSERT_TRUE(params.ok()) << params.status();
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, params->data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);
  EXPECT_EQ(allocator.stats().current_of(MemoryCategory::kParams), 1 << 20);
  // 1 MiB held + 3 MiB asked > 3 MiB budget: refused before cudaMalloc is called.
  auto grads = allocator.allocate(3 << 20, MemoryCategory::kGrads, Device::cuda(0));
  EXPECT_TRUE(is_out_of_memory(grads.status())) << grads.status();
  EXPECT_THAT(grads.status().message(), HasSubstr("grads"));
  params->reset();
  EXPECT_EQ(allocator.stats().current_total, 0);
  EXPECT_EQ(allocator.stats().peak_total, 1 << 20);
}

TEST(CudaRuntimeTest, CopyBytesRoundTripsThroughTheDevice) {
  ZERO_SKIP_WITHOUT_GPU();
  Allocator allocator;
  auto on_device = allocator.allocate(16, MemoryCategory::kWorkspace, Device::cuda(0));
  ASSERT_TRUE(on_device.ok()) << on_device.status();
  const std::vector<float> host = {1.0f, -2.5f, 3.0f, 1e-30f};
  std::vector<float> back(4);
  ASSERT_TRUE(copy_bytes(on_device->data(), Device::cuda(0), host.data(), Device::cpu(), 16).ok());
  ASSERT_TRUE(copy_bytes(back.data(), Device::cpu(), on_device->data(), Device::cuda(0), 16).ok());
  EXPECT_EQ(back, host);
}

}  // namespace
}  // namespace zero
