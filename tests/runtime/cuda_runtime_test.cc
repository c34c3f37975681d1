// CUDA streams, events and device memory through the accounting allocator. GPU tests skip without a GPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/allocator.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"
#include "tests/runtime/stream_hold.h"
#include "tests/skip_without_gpu.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::StreamHold;

TEST(CudaRuntimeTest, StreamOnADeviceThatIsNotThereIsAnError) {
  const int missing = cuda_device_count();
  auto stream = CudaStream::create(missing);
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
  Allocator on_cuda(/*rank=*/2, /*budget_bytes=*/1 << 20);
  auto cpu = on_cpu.allocate(2 << 20, MemoryCategory::kGrads, Device::cpu());
  auto cuda = on_cuda.allocate(2 << 20, MemoryCategory::kGrads, Device::cuda(0));
  ASSERT_TRUE(is_out_of_memory(cuda.status())) << cuda.status();
  EXPECT_EQ(cuda.status(), cpu.status());
}

TEST(CudaRuntimeTest, AllocatesOnCuda0AndAccountsEveryByte) {
  ZERO_SKIP_WITHOUT_GPU();
  Allocator allocator(/*rank=*/0, /*budget_bytes=*/3 << 20);
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

TEST(CudaRuntimeTest, EventCompletesAfterTheWorkRecordedBeforeIt) {
  ZERO_SKIP_WITHOUT_GPU();
  auto stream = CudaStream::create(0);
  auto event = CudaEvent::create(0);
  ASSERT_TRUE(stream.ok() && event.ok());
  Allocator allocator;
  auto buffer = allocator.allocate(4096, MemoryCategory::kWorkspace, Device::cuda(0));
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(stream->wait_for_default_stream(*event).ok());  // the allocation is ordered on the default stream
  ASSERT_EQ(cudaMemsetAsync(buffer->data(), 0x5a, 4096, stream->get()), cudaSuccess);
  ASSERT_TRUE(event->record(*stream).ok());
  ASSERT_TRUE(event->synchronize(absl::Now() + absl::Seconds(60)).ok());
  EXPECT_TRUE(event->query().value());
  std::vector<uint8_t> host(4096);
  ASSERT_EQ(cudaMemcpy(host.data(), buffer->data(), 4096, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, std::vector<uint8_t>(4096, 0x5a));
}

// Fills a buffer with `value` on `producer`, held until `order` has ordered `consumer` after the fill and
// a copy of the buffer is enqueued there; returns the copy: all zeros if the order did not hold.
absl::StatusOr<std::vector<uint8_t>> copy_after_late_fill(cudaStream_t producer, uint8_t value, CudaStream& consumer,
                                                          const std::function<absl::Status()>& order) {
  Allocator allocator;
  ZERO_ASSIGN_OR_RETURN(Buffer src, allocator.allocate(1024, MemoryCategory::kWorkspace, Device::cuda(0)));
  ZERO_ASSIGN_OR_RETURN(Buffer dst, allocator.allocate(1024, MemoryCategory::kWorkspace, Device::cuda(0)));
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemset(src.data(), 0, 1024));
  ZERO_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  StreamHold hold(producer);
  ZERO_CUDA_RETURN_IF_ERROR(hold.launched());
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src.data(), value, 1024, producer));
  ZERO_RETURN_IF_ERROR(order());
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data(), src.data(), 1024, cudaMemcpyDeviceToDevice, consumer.get()));
  hold.release();
  ZERO_RETURN_IF_ERROR(consumer.synchronize(absl::Now() + absl::Seconds(60)));
  std::vector<uint8_t> host(1024);
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), dst.data(), 1024, cudaMemcpyDeviceToHost));
  return host;
}

TEST(CudaRuntimeTest, StreamWaitingOnAnEventRunsAfterTheOtherStreamsWork) {
  ZERO_SKIP_WITHOUT_GPU();
  auto producer = CudaStream::create(0);
  auto consumer = CudaStream::create(0);
  auto ready = CudaEvent::create(0);
  ASSERT_TRUE(producer.ok() && consumer.ok() && ready.ok());
  const auto copied = copy_after_late_fill(producer->get(), 0x11, *consumer, [&]() -> absl::Status {
    ZERO_RETURN_IF_ERROR(ready->record(*producer));
    return consumer->wait(*ready);
  });
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(*copied, std::vector<uint8_t>(1024, 0x11));
}

TEST(CudaRuntimeTest, WaitForDefaultStreamOrdersAfterItsWorkSoFar) {
  ZERO_SKIP_WITHOUT_GPU();
  auto stream = CudaStream::create(0);
  auto marker = CudaEvent::create(0);
  ASSERT_TRUE(stream.ok() && marker.ok());
  const auto copied =
      copy_after_late_fill(cudaStreamLegacy, 0x22, *stream, [&] { return stream->wait_for_default_stream(*marker); });
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(*copied, std::vector<uint8_t>(1024, 0x22));
}

TEST(CudaRuntimeTest, OwnStreamRunsBesideTheDefaultStream) {
  ZERO_SKIP_WITHOUT_GPU();
  auto stream = CudaStream::create(0);
  ASSERT_TRUE(stream.ok());
  StreamHold busy(cudaStreamLegacy);  // the default stream stays busy; a blocking stream would wait for it
  ASSERT_EQ(busy.launched(), cudaSuccess);
  const absl::Status own = stream->synchronize(absl::Now() + absl::Seconds(60));
  EXPECT_TRUE(own.ok()) << own;
  busy.release();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(CudaRuntimeTest, SynchronizeGivesUpAtTheDeadline) {
  ZERO_SKIP_WITHOUT_GPU();
  auto stream = CudaStream::create(0);
  ASSERT_TRUE(stream.ok());
  StreamHold hold(stream->get());
  ASSERT_EQ(hold.launched(), cudaSuccess);
  const absl::Status early = stream->synchronize(absl::Now() + absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(early)) << early;
  hold.release();
  EXPECT_TRUE(stream->synchronize(absl::Now() + absl::Seconds(60)).ok());
}

TEST(CudaRuntimeTest, SynchronizeReturnsTheErrorItsCheckReports) {
  ZERO_SKIP_WITHOUT_GPU();
  auto stream = CudaStream::create(0);
  auto event = CudaEvent::create(0);
  ASSERT_TRUE(stream.ok() && event.ok());
  StreamHold hold(stream->get());
  ASSERT_EQ(hold.launched(), cudaSuccess);
  ASSERT_TRUE(event->record(*stream).ok());
  const absl::Status status =
      event->synchronize(absl::Now() + absl::Seconds(60), [] { return absl::AbortedError("peer 3 failed"); });
  EXPECT_EQ(status, absl::AbortedError("peer 3 failed"));
  hold.release();
  EXPECT_TRUE(stream->synchronize(absl::Now() + absl::Seconds(60)).ok());
}

}  // namespace
}  // namespace zero
