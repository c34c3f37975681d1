// What every DeviceApi shares, on each implementation: deadline-bounded waits, ordering after the legacy default
// stream, and owned streams and events. The simulated device runs everywhere; CUDA cases skip without a GPU.
#include "runtime/device_api.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/pinned_uploads.h"
#include "runtime/sim/sim_device.h"
#include "runtime/status.h"
#include "tests/runtime/stream_hold.h"
#include "tests/skip_without_gpu.h"
#ifdef ZERO_HAS_CUDA
#include "runtime/cuda/cuda_api.h"
#endif

namespace zero {
namespace {

using testing::StreamHold;

enum class Where { kSim, kCuda };

class DeviceApiTest : public ::testing::TestWithParam<Where> {
 protected:
  void SetUp() override {
    if (GetParam() == Where::kSim) {
      absl::StatusOr<std::unique_ptr<sim::SimDevice>> sim = sim::SimDevice::create();
      ASSERT_TRUE(sim.ok()) << sim.status();
      api_ = std::move(sim).value();
      return;
    }
#ifdef ZERO_HAS_CUDA
    ZERO_SKIP_WITHOUT_GPU();
    api_ = std::make_unique<CudaApi>();
#else
    GTEST_SKIP() << "zero was built without CUDA";
#endif
  }

  DeviceApi& api() { return *api_; }

  // An event recorded on a stream behind a StreamHold: not done until hold->release().
  struct HeldWork {
    OwnedStream stream;
    std::unique_ptr<StreamHold> hold;
    OwnedEvent done;
  };
  HeldWork held_work() {
    HeldWork w{stream(), nullptr, event()};
    w.hold = std::make_unique<StreamHold>(api(), w.stream.get());
    EXPECT_TRUE(w.hold->launched().ok()) << w.hold->launched();
    EXPECT_TRUE(api().record(w.done.get(), w.stream.get()).ok());
    return w;
  }

  OwnedStream stream() {
    absl::StatusOr<OwnedStream> made = OwnedStream::create(api(), 0);
    EXPECT_TRUE(made.ok()) << made.status();
    return std::move(made).value();
  }
  OwnedEvent event() {
    absl::StatusOr<OwnedEvent> made = OwnedEvent::create(api(), 0);
    EXPECT_TRUE(made.ok()) << made.status();
    return std::move(made).value();
  }

 private:
  std::unique_ptr<DeviceApi> api_;
};

TEST_P(DeviceApiTest, SynchronizeUntilReturnsOnceTheRecordedWorkIsDone) {
  HeldWork w = held_work();
  EXPECT_EQ(api().query(w.done.get()).value_or(true), false);
  w.hold->release();
  const absl::Status status = synchronize_until(api(), w.done.get(), absl::Now() + absl::Seconds(60));
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(api().query(w.done.get()).value_or(false), true);
}

TEST_P(DeviceApiTest, SynchronizeUntilGivesUpAtTheDeadline) {
  HeldWork w = held_work();
  const absl::Status early = synchronize_until(api(), w.done.get(), absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(early, absl::DeadlineExceededError("the device work did not finish before the deadline"));
  w.hold->release();
  EXPECT_TRUE(synchronize_until(api(), w.done.get(), absl::Now() + absl::Seconds(60)).ok());
}

TEST_P(DeviceApiTest, SynchronizeUntilReturnsTheErrorItsCheckReports) {
  HeldWork w = held_work();
  const absl::Status status = synchronize_until(api(), w.done.get(), absl::Now() + absl::Seconds(60),
                                                [] { return absl::AbortedError("peer 3 failed"); });
  EXPECT_EQ(status, absl::AbortedError("peer 3 failed"));
}

// A non-blocking stream runs beside a busy legacy default stream, as the communication streams must.
TEST_P(DeviceApiTest, NonBlockingStreamRunsBesideTheHeldLegacyStream) {
  OwnedStream s = stream();
  OwnedEvent done = event();
  StreamHold busy(api(), Stream::legacy(0));
  ASSERT_TRUE(busy.launched().ok()) << busy.launched();
  ASSERT_TRUE(api().record(done.get(), s.get()).ok());
  const absl::Status own = synchronize_until(api(), done.get(), absl::Now() + absl::Seconds(60));
  EXPECT_TRUE(own.ok()) << own;
}

// Bytes copied in on the held legacy stream, then out on another stream that waits for the legacy stream: the copy
// out sees them only if the wait ordered it (on the simulated device, the checker also names a missing wait).
TEST_P(DeviceApiTest, OrderAfterOrdersAfterTheOtherStreamsWorkSoFar) {
  constexpr size_t kBytes = 1024;
  OwnedStream s = stream();
  OwnedEvent marker = event();
  absl::StatusOr<void*> in = api().allocate_pinned(kBytes);
  absl::StatusOr<void*> out = api().allocate_pinned(kBytes);
  absl::StatusOr<void*> on_device = api().allocate(kBytes, Stream::legacy(0));
  ASSERT_TRUE(in.ok() && out.ok() && on_device.ok());
  std::memset(*in, 0x22, kBytes);
  std::memset(*out, 0, kBytes);
  ASSERT_TRUE(api().copy(*on_device, *out, kBytes).ok());  // zeros: pool memory may hold an earlier run's bytes
  {
    StreamHold hold(api(), Stream::legacy(0));
    ASSERT_TRUE(hold.launched().ok()) << hold.launched();
    ASSERT_TRUE(api().copy_async(*on_device, *in, kBytes, Stream::legacy(0)).ok());
    ASSERT_TRUE(order_after(api(), s.get(), Stream::legacy(0), marker.get()).ok());
    ASSERT_TRUE(api().copy_async(*out, *on_device, kBytes, s.get()).ok());
  }
  ASSERT_TRUE(api().synchronize(s.get()).ok());
  EXPECT_EQ(std::vector<uint8_t>(static_cast<uint8_t*>(*out), static_cast<uint8_t*>(*out) + kBytes),
            std::vector<uint8_t>(kBytes, 0x22));
  EXPECT_TRUE(api().free(*on_device, s.get()).ok());
  EXPECT_TRUE(api().synchronize_device(0).ok());
  EXPECT_TRUE(api().free_pinned(*in).ok());
  EXPECT_TRUE(api().free_pinned(*out).ok());
}

// The caller's stream (legacy) is held while it queues an upload: the joined stream's read of it still sees its bytes,
// and the caller's overwrite queued after the scope still comes after that read. On the simulated device the checker
// also holds both orders (each missing one is a violation there).
TEST_P(DeviceApiTest, AJoinedStreamRunsBetweenTheCallersWorkBeforeAndAfter) {
  constexpr size_t kBytes = 1024;
  const Device device = GetParam() == Where::kSim ? Device::sim(0) : Device::cuda(0);
  const Stream caller = Stream::legacy(0);
  OwnedStream s = stream();
  OwnedEvent marker = event();
  absl::StatusOr<void*> first = api().allocate_pinned(kBytes);
  absl::StatusOr<void*> second = api().allocate_pinned(kBytes);
  absl::StatusOr<void*> out = api().allocate_pinned(kBytes);
  absl::StatusOr<void*> on_device = api().allocate(kBytes, caller);
  ASSERT_TRUE(first.ok() && second.ok() && out.ok() && on_device.ok());
  std::memset(*first, 0x22, kBytes);
  std::memset(*second, 0x33, kBytes);
  std::memset(*out, 0, kBytes);
  {
    StreamHold hold(api(), caller);
    ASSERT_TRUE(hold.launched().ok()) << hold.launched();
    ASSERT_TRUE(api().copy_async(*on_device, *first, kBytes, caller).ok());
    {
      const JoinedStreamScope joined(&api(), device, s.get(), marker.get());
      ASSERT_TRUE(joined.status().ok()) << joined.status();
      EXPECT_EQ(current_stream(device), s.get());
      ASSERT_TRUE(api().copy_async(*out, *on_device, kBytes, current_stream(device)).ok());
    }
    EXPECT_EQ(current_stream(device), caller);
    ASSERT_TRUE(api().copy_async(*on_device, *second, kBytes, caller).ok());
  }
  ASSERT_TRUE(api().synchronize_device(0).ok());
  EXPECT_EQ(std::vector<uint8_t>(static_cast<uint8_t*>(*out), static_cast<uint8_t*>(*out) + kBytes),
            std::vector<uint8_t>(kBytes, 0x22));
  EXPECT_TRUE(api().free(*on_device, caller).ok());
  EXPECT_TRUE(api().synchronize_device(0).ok());
  for (void* pinned : {*first, *second, *out}) EXPECT_TRUE(api().free_pinned(pinned).ok());
}

// An owner destroys its handle when dropped; a move hands the handle over (so it outlives the moved-from owner), and
// a move assignment leaves the target's old handle to the source, destroyed with it.
TEST_P(DeviceApiTest, OwnedHandlesAreDestroyedWithTheirOwnerOnly) {
  const auto live = [&](Event e) { return api().query(e).ok(); };
  OwnedEvent first = event();
  const Event handed = first.get();
  {
    OwnedEvent second = std::move(first);
    EXPECT_TRUE(live(handed)) << "destroyed by the move";
  }
  EXPECT_FALSE(live(handed)) << "not destroyed with its new owner";

  OwnedEvent target = event(), source = event();
  const Event old_target = target.get(), old_source = source.get();
  target = std::move(source);
  EXPECT_EQ(target.get().id, old_source.id);
  {
    OwnedEvent dropped = std::move(source);  // holds the target's old handle
    EXPECT_TRUE(live(old_target));
  }
  EXPECT_FALSE(live(old_target)) << "the target's old handle outlived both owners";
  EXPECT_TRUE(live(old_source));

  Stream gone{};
  {
    OwnedStream s = stream();
    gone = s.get();
  }
  EXPECT_TRUE(absl::IsInvalidArgument(api().destroy_stream(gone)));
}

// The device bytes at `ptr`, through pinned memory.
std::vector<uint8_t> read_back(DeviceApi& api, const void* ptr, size_t bytes) {
  PinnedBuffer host = PinnedBuffer::allocate(api, bytes).value();
  EXPECT_TRUE(api.copy(host.data(), ptr, bytes).ok());
  const auto* data = static_cast<const uint8_t*>(host.data());
  return std::vector<uint8_t>(data, data + bytes);
}

// No bytes asked for, none pinned: an empty buffer, as a default-made one (a rank whose range of a unit is empty).
TEST_P(DeviceApiTest, APinnedBufferOfNoBytesIsEmpty) {
  absl::StatusOr<PinnedBuffer> none = PinnedBuffer::allocate(api(), 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->data(), nullptr);
  EXPECT_EQ(none->bytes(), 0u);
}

// Two uploads while the stream is held: each lands its own bytes (the second did not reuse the first's block,
// whose copy had not run), the sources were free at once, and a later upload reuses a block.
TEST_P(DeviceApiTest, PinnedUploadsLandWithoutWaitingAndReuseBlocksOnlyOnceCopied) {
  constexpr size_t kBytes = 4096;
  PinnedUploads uploads(api());
  absl::StatusOr<void*> first = api().allocate(kBytes, Stream::legacy(0));
  absl::StatusOr<void*> second = api().allocate(kBytes, Stream::legacy(0));
  ASSERT_TRUE(first.ok() && second.ok());
  std::vector<uint8_t> source(kBytes, 0x11);
  auto* sim = dynamic_cast<sim::SimDevice*>(&api());
  const uint64_t waits = sim != nullptr ? sim->host_synchronizations() : 0;
  {
    StreamHold hold(api(), Stream::legacy(0));
    ASSERT_TRUE(hold.launched().ok()) << hold.launched();
    ASSERT_TRUE(uploads.upload(*first, source.data(), kBytes, Stream::legacy(0)).ok());
    std::fill(source.begin(), source.end(), 0x22);  // free again at once
    ASSERT_TRUE(uploads.upload(*second, source.data(), kBytes, Stream::legacy(0)).ok());
    EXPECT_EQ(uploads.blocks(), 2u);
    if (sim != nullptr) {
      EXPECT_EQ(sim->host_synchronizations(), waits) << "an upload waited";
    }
  }
  EXPECT_EQ(read_back(api(), *first, kBytes), std::vector<uint8_t>(kBytes, 0x11));
  EXPECT_EQ(read_back(api(), *second, kBytes), std::vector<uint8_t>(kBytes, 0x22));
  ASSERT_TRUE(uploads.upload(*first, source.data(), kBytes, Stream::legacy(0)).ok());
  EXPECT_EQ(uploads.blocks(), 2u);
  EXPECT_EQ(read_back(api(), *first, kBytes), std::vector<uint8_t>(kBytes, 0x22));
  EXPECT_TRUE(api().free(*first, Stream::legacy(0)).ok());
  EXPECT_TRUE(api().free(*second, Stream::legacy(0)).ok());
}

INSTANTIATE_TEST_SUITE_P(SimAndCuda, DeviceApiTest, ::testing::Values(Where::kSim, Where::kCuda),
                         [](const ::testing::TestParamInfo<Where>& info) -> std::string {
                           return info.param == Where::kSim ? "Sim" : "Cuda";
                         });

// current_stream: the legacy default stream until a StreamScope on this thread chooses another, per device; scopes
// nest and restore, also one that names the legacy stream; a scope with no stream does nothing; other threads keep
// their own.
TEST(CurrentStream, IsTheLegacyStreamUnlessAScopeOnThisThreadChoseAnother) {
  const Device sim0 = Device::sim(0), sim1 = Device::sim(1), cuda0 = Device::cuda(0);
  EXPECT_EQ(current_stream(sim0), Stream::legacy(0));
  {
    const StreamScope outer(sim0, Stream{0, 7});
    EXPECT_EQ(current_stream(sim0), (Stream{0, 7}));
    EXPECT_EQ(current_stream(cuda0), Stream::legacy(0)) << "cuda:0 is another device than sim:0";
    EXPECT_EQ(current_stream(sim1), Stream::legacy(1));
    {
      const StreamScope inner(sim0, Stream{0, 9});
      const StreamScope other_device(sim1, Stream{1, 3});
      const StreamScope none(sim0, std::nullopt);
      EXPECT_EQ(current_stream(sim0), (Stream{0, 9}));
      EXPECT_EQ(current_stream(sim1), (Stream{1, 3}));
      Stream seen_elsewhere{};
      std::thread([&] { seen_elsewhere = current_stream(sim0); }).join();
      EXPECT_EQ(seen_elsewhere, Stream::legacy(0));
    }
    EXPECT_EQ(current_stream(sim0), (Stream{0, 7}));
    EXPECT_EQ(current_stream(sim1), Stream::legacy(1));
  }
  EXPECT_EQ(current_stream(sim0), Stream::legacy(0));
  {  // an outer scope naming the legacy stream itself keeps it through an inner one's end
    const StreamScope legacy(sim0, Stream::legacy(0));
    {
      const StreamScope inner(sim0, Stream{0, 5});
      EXPECT_EQ(current_stream(sim0), (Stream{0, 5}));
    }
    EXPECT_EQ(current_stream(sim0), Stream::legacy(0));
  }
  EXPECT_EQ(current_stream(sim0), Stream::legacy(0));
}

}  // namespace
}  // namespace zero
