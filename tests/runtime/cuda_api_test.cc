// DeviceApi on CUDA: copies, launches, event ordering, and the handles and memory it refuses. GPU tests skip
// without a GPU.
#include "runtime/cuda/cuda_api.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cuda/cuda_check.h"
#include "tests/skip_without_gpu.h"

namespace zero {
namespace {

constexpr int kCount = 256;
constexpr size_t kBytes = kCount * sizeof(float);

// from, from + 1, ...: tests start from different values, so memory the pool hands out again cannot pass a check.
std::vector<float> ramp(float from) {
  std::vector<float> values(kCount);
  for (int i = 0; i < kCount; ++i) values[i] = from + static_cast<float>(i);
  return values;
}

// Pinned host memory holding `values`.
float* pinned(CudaApi& api, const std::vector<float>& values) {
  auto ptr = api.allocate_pinned(values.size() * sizeof(float));
  EXPECT_TRUE(ptr.ok()) << ptr.status();
  if (!ptr.ok()) return nullptr;
  auto* data = static_cast<float*>(*ptr);
  std::copy(values.begin(), values.end(), data);
  return data;
}

TEST(CudaApiTest, IsTheCudaDeviceTypeAndCountsDevicesWithoutFailing) {
  EXPECT_EQ(cuda_api().type(), DeviceType::kCuda);
  EXPECT_EQ(cuda_api().device_count(), cuda_device_count());
}

TEST(CudaApiTest, HandlesItNeverMadeAreRefusedNamingThem) {
  CudaApi api;
  EXPECT_EQ(api.destroy_stream(Stream{0, 7}),
            absl::InvalidArgumentError("unknown stream 7 of cuda:0: not created by this CudaApi, or destroyed"));
  EXPECT_EQ(api.query(Event{1, 9}).status(),
            absl::InvalidArgumentError("unknown event 9 of cuda:1: not created by this CudaApi, or destroyed"));
  EXPECT_EQ(api.destroy_stream(Stream::legacy(0)),
            absl::InvalidArgumentError("the legacy default stream of cuda:0 cannot be destroyed"));
}

TEST(CudaApiTest, AllocateAndCopyRoundTripThroughPinnedMemory) {
  ZERO_SKIP_WITHOUT_GPU();
  CudaApi api;
  const std::vector<float> values = ramp(0.25f);
  float* up = pinned(api, values);
  float* down = pinned(api, std::vector<float>(kCount, -1.0f));
  ASSERT_TRUE(up != nullptr && down != nullptr);
  auto stream = api.create_stream(0, StreamFlags::kNonBlocking);
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto device = api.allocate(kBytes, *stream);
  ASSERT_TRUE(device.ok()) << device.status();

  ASSERT_TRUE(api.copy_async(*device, up, kBytes, *stream).ok());
  ASSERT_TRUE(api.copy_async(down, *device, kBytes, *stream).ok());
  ASSERT_TRUE(api.synchronize(*stream).ok());
  EXPECT_EQ(std::vector<float>(down, down + kCount), values);
  std::vector<float> pageable(kCount, -1.0f);  // a synchronous copy takes pageable memory
  ASSERT_TRUE(api.copy(pageable.data(), *device, kBytes).ok());
  EXPECT_EQ(pageable, values);

  ASSERT_TRUE(api.free(*device, *stream).ok());
  ASSERT_TRUE(api.synchronize(*stream).ok());
  EXPECT_TRUE(api.destroy_stream(*stream).ok());
  EXPECT_TRUE(api.free_pinned(up).ok());
  EXPECT_TRUE(api.free_pinned(down).ok());
}

// No kernel: the body queues a memset on the native stream it gets, which shows that stream is the launch's.
TEST(CudaApiTest, LaunchRunsTheBodyAtOnceOnTheNativeStream) {
  ZERO_SKIP_WITHOUT_GPU();
  CudaApi api;
  ASSERT_TRUE(api.set_current_device(0).ok());
  auto stream = api.create_stream(0, StreamFlags::kNonBlocking);
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto device = api.allocate(64, *stream);
  ASSERT_TRUE(device.ok()) << device.status();
  auto* bytes = static_cast<unsigned char*>(*device);
  bool ran = false;
  KernelLaunch fill{"fill", {{bytes, 64, true}}, [&](const LaunchContext& ctx) -> absl::Status {
                      ran = true;
                      EXPECT_NE(ctx.native_stream(), nullptr);
                      EXPECT_EQ(ctx.host_pointer(bytes + 16, 48).value_or(nullptr), bytes + 16);
                      EXPECT_EQ(ctx.host_pointer(bytes + 16, 49).status().code(), absl::StatusCode::kInvalidArgument);
                      return cuda_status(
                          cudaMemsetAsync(bytes, 0x2a, 64, static_cast<cudaStream_t>(ctx.native_stream())),
                          "cudaMemsetAsync");
                    }};
  ASSERT_TRUE(api.launch(*stream, std::move(fill)).ok());
  EXPECT_TRUE(ran);  // CUDA calls the body before launch returns

  std::vector<unsigned char> out(64, 0);
  ASSERT_TRUE(api.synchronize(*stream).ok());  // copy waits for the legacy stream only, not a non-blocking one
  ASSERT_TRUE(api.copy(out.data(), bytes, 64).ok());
  EXPECT_EQ(out, std::vector<unsigned char>(64, 0x2a));
  ASSERT_TRUE(api.free(bytes, *stream).ok());
  EXPECT_TRUE(api.destroy_stream(*stream).ok());
}

// Stream a holds back its copy up behind a 200 ms host function; only the event keeps stream b's copy down
// from reading the device buffer before it is filled.
TEST(CudaApiTest, AnEventOrdersACopyBetweenTwoNonBlockingStreams) {
  ZERO_SKIP_WITHOUT_GPU();
  CudaApi api;
  ASSERT_TRUE(api.set_current_device(0).ok());
  const std::vector<float> values = ramp(1000.5f);
  float* up = pinned(api, values);
  float* down = pinned(api, std::vector<float>(kCount, -1.0f));
  ASSERT_TRUE(up != nullptr && down != nullptr);
  auto a = api.create_stream(0, StreamFlags::kNonBlocking);
  auto b = api.create_stream(0, StreamFlags::kNonBlocking);
  auto filled = api.create_event(0);
  ASSERT_TRUE(a.ok() && b.ok() && filled.ok());
  auto device = api.allocate(kBytes, *a);
  ASSERT_TRUE(device.ok()) << device.status();

  KernelLaunch stall{"stall", {}, [](const LaunchContext& ctx) {
                       auto sleep = [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
                       return cuda_status(
                           cudaLaunchHostFunc(static_cast<cudaStream_t>(ctx.native_stream()), sleep, nullptr),
                           "cudaLaunchHostFunc");
                     }};
  ASSERT_TRUE(api.launch(*a, std::move(stall)).ok());
  ASSERT_TRUE(api.copy_async(*device, up, kBytes, *a).ok());
  ASSERT_TRUE(api.record(*filled, *a).ok());
  ASSERT_TRUE(api.wait(*b, *filled).ok());
  ASSERT_TRUE(api.copy_async(down, *device, kBytes, *b).ok());
  ASSERT_TRUE(api.synchronize(*b).ok());

  EXPECT_EQ(std::vector<float>(down, down + kCount), values);
  EXPECT_TRUE(api.query(*filled).value_or(false));  // b finished after the event, so it has too
  ASSERT_TRUE(api.free(*device, *b).ok());
  ASSERT_TRUE(api.synchronize_device(0).ok());
  EXPECT_TRUE(api.destroy_event(*filled).ok());
  EXPECT_TRUE(api.destroy_stream(*a).ok());
  EXPECT_TRUE(api.destroy_stream(*b).ok());
  EXPECT_TRUE(api.free_pinned(up).ok());
  EXPECT_TRUE(api.free_pinned(down).ok());
}

TEST(CudaApiTest, CopyAsyncFromOrToPageableMemoryIsRefused) {
  ZERO_SKIP_WITHOUT_GPU();
  CudaApi api;
  const Stream stream = Stream::legacy(0);
  auto device = api.allocate(kBytes, stream);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<float> pageable = ramp(-50.0f);

  EXPECT_EQ(
      api.copy_async(*device, pageable.data(), kBytes, stream),
      absl::InvalidArgumentError("copy_async: the source is pageable host memory; allocate it with allocate_pinned"));
  EXPECT_EQ(api.copy_async(pageable.data(), *device, kBytes, stream),
            absl::InvalidArgumentError(
                "copy_async: the destination is pageable host memory; allocate it with allocate_pinned"));
  EXPECT_EQ(pageable, ramp(-50.0f));  // nothing was copied
  ASSERT_TRUE(api.free(*device, stream).ok());
  EXPECT_TRUE(api.synchronize(stream).ok());  // a refusal is not a device failure: the API still works
}

TEST(CudaApiTest, ADestroyedStreamIsRefusedNamingIt) {
  ZERO_SKIP_WITHOUT_GPU();
  CudaApi api;
  ASSERT_TRUE(api.set_current_device(0).ok());
  auto stream = api.create_stream(0, StreamFlags::kBlocking);
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE(api.destroy_stream(*stream).ok());

  const absl::Status unknown = absl::InvalidArgumentError(
      absl::StrCat("unknown stream ", stream->id, " of cuda:0: not created by this CudaApi, or destroyed"));
  bool ran = false;
  EXPECT_EQ(api.launch(*stream, {"noop",
                                 {},
                                 [&](const LaunchContext&) {
                                   ran = true;
                                   return absl::OkStatus();
                                 }}),
            unknown);
  EXPECT_FALSE(ran);
  EXPECT_EQ(api.synchronize(*stream), unknown);
  EXPECT_EQ(api.allocate(16, *stream).status(), unknown);
  EXPECT_EQ(api.destroy_stream(*stream), unknown);
}

TEST(CudaApiTest, LaunchOnAStreamOfAnotherDeviceThanTheCurrentIsRefused) {
  ZERO_SKIP_WITHOUT_GPU();
  CudaApi api;
  if (api.device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  auto other = api.create_stream(1, StreamFlags::kNonBlocking);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(api.set_current_device(0).ok());

  bool ran = false;
  const absl::Status refused = api.launch(*other, {"noop", {}, [&](const LaunchContext&) {
                                                     ran = true;
                                                     return absl::OkStatus();
                                                   }});
  EXPECT_EQ(refused, absl::InvalidArgumentError("launch noop: the stream is on cuda:1 but cuda:0 is current, and "
                                                "CUDA launches only on the current device"));
  EXPECT_FALSE(ran);
  ASSERT_TRUE(api.set_current_device(1).ok());  // on its own device the same stream launches
  EXPECT_TRUE(api.launch(*other, {"noop",
                                  {},
                                  [&](const LaunchContext&) {
                                    ran = true;
                                    return absl::OkStatus();
                                  }})
                  .ok());
  EXPECT_TRUE(ran);
  EXPECT_TRUE(api.set_current_device(0).ok());
  EXPECT_TRUE(api.destroy_stream(*other).ok());
}

}  // namespace
}  // namespace zero
