// The simulated device: CUDA's ordering rules, stream-ordered memory, and the happens-before checker finding each
// planted ordering bug by name (and missing it when switched off).
#include "runtime/sim/sim_device.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/cpu_threads.h"
#include "runtime/status.h"

namespace zero::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::unique_ptr<SimDevice> make_sim(SimOptions options = {}) {
  absl::StatusOr<std::unique_ptr<SimDevice>> sim = SimDevice::create(options);
  EXPECT_TRUE(sim.ok()) << sim.status();
  return std::move(sim).value();
}

// A kernel writing `value` into n floats.
KernelLaunch fill(float* out, size_t n, float value) {
  return {"fill", {{out, n * 4, true}}, [=](const LaunchContext& ctx) -> absl::Status {
            ZERO_ASSIGN_OR_RETURN(void* host, ctx.host_pointer(out, n * 4));
            std::fill_n(static_cast<float*>(host), n, value);
            return absl::OkStatus();
          }};
}

// A kernel computing out[i] = in[i] + 1.
KernelLaunch add_one(float* out, const float* in, size_t n) {
  return {"add_one", {{in, n * 4, false}, {out, n * 4, true}}, [=](const LaunchContext& ctx) -> absl::Status {
            ZERO_ASSIGN_OR_RETURN(void* x, ctx.host_pointer(in, n * 4));
            ZERO_ASSIGN_OR_RETURN(void* y, ctx.host_pointer(out, n * 4));
            for (size_t i = 0; i < n; ++i) static_cast<float*>(y)[i] = static_cast<float*>(x)[i] + 1;
            return absl::OkStatus();
          }};
}

float* device_floats(SimDevice& sim, size_t n, Stream stream = Stream::legacy(0)) {
  absl::StatusOr<void*> p = sim.allocate(n * 4, stream);
  EXPECT_TRUE(p.ok()) << p.status();
  return static_cast<float*>(p.value_or(nullptr));
}

std::vector<float> read_back(SimDevice& sim, const float* device, size_t n) {
  std::vector<float> host(n);
  const absl::Status copied = sim.copy(host.data(), device, n * 4);
  EXPECT_TRUE(copied.ok()) << copied;
  return host;
}

Stream new_stream(SimDevice& sim, StreamFlags flags, int device = 0) {
  absl::StatusOr<Stream> s = sim.create_stream(device, flags);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.value_or(Stream{});
}

TEST(SimDeviceTest, CopiesRoundTripAndNewMemoryIsNaN) {
  auto sim = make_sim();
  float* x = device_floats(*sim, 4);
  for (float v : read_back(*sim, x, 4)) EXPECT_TRUE(std::isnan(v));  // never trust uninitialized device memory
  const float values[4] = {1, 2, 3, 4};
  ASSERT_TRUE(sim->copy(x, values, sizeof(values)).ok());
  EXPECT_EQ(read_back(*sim, x, 4), std::vector<float>({1, 2, 3, 4}));
}

TEST(SimDeviceDeathTest, HostReadOfDeviceMemoryCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto sim = make_sim();
  float* x = device_floats(*sim, 4);
  ASSERT_TRUE(sim->synchronize_device(0).ok());
  EXPECT_DEATH({ [[maybe_unused]] volatile float v = *static_cast<volatile float*>(x); }, "");
}

TEST(SimDeviceTest, AStreamRunsItsOperationsInOrder) {
  auto sim = make_sim({.max_delay_us = 200, .seed = 7});
  const Stream s = new_stream(*sim, StreamFlags::kNonBlocking);
  float* x = device_floats(*sim, 256, s);
  ASSERT_TRUE(sim->launch(s, fill(x, 256, 0)).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(sim->launch(s, add_one(x, x, 256)).ok());
  ASSERT_TRUE(sim->synchronize(s).ok());
  EXPECT_EQ(read_back(*sim, x, 256), std::vector<float>(256, 20.0f));
}

// A kernel runs as the rank thread that launched it would, with its share of the cores, also where ranks share a
// stream (the legacy one).
TEST(SimDeviceTest, KernelsRunWithTheLaunchingThreadsCpuThreads) {
  auto sim = make_sim();
  const auto threads_seen = [&](int launcher_threads) {
    int seen = 0;
    std::thread([&] {
      set_cpu_threads(launcher_threads);
      KernelLaunch probe{"probe", {}, [&](const LaunchContext&) {
                           seen = cpu_threads();
                           return absl::OkStatus();
                         }};
      EXPECT_TRUE(sim->launch(Stream::legacy(0), std::move(probe)).ok());
      EXPECT_TRUE(sim->synchronize(Stream::legacy(0)).ok());
    }).join();
    return seen;
  };
  EXPECT_EQ(threads_seen(3), 3);
  EXPECT_EQ(threads_seen(1), 1);
  EXPECT_EQ(threads_seen(2), 2);
}

TEST(SimDeviceTest, LegacyStreamWaitsForBlockingStreamsNotNonBlockingOnes) {
  auto sim = make_sim({.max_delay_us = 100});
  const Stream blocking = new_stream(*sim, StreamFlags::kBlocking);
  float* x = device_floats(*sim, 64);
  ASSERT_TRUE(sim->synchronize_device(0).ok());  // the allocation (legacy) before the other streams use it
  ASSERT_TRUE(sim->launch(blocking, fill(x, 64, 3)).ok());
  EXPECT_EQ(read_back(*sim, x, 64), std::vector<float>(64, 3.0f));  // copy() is on the legacy stream

  const Stream non_blocking = new_stream(*sim, StreamFlags::kNonBlocking);
  ASSERT_TRUE(sim->launch(non_blocking, fill(x, 64, 5)).ok());
  std::vector<float> host(64);
  const absl::Status read = sim->copy(host.data(), x, 64 * 4);
  EXPECT_THAT(read.ToString(), AllOf(HasSubstr("copy of 256 bytes on sim:0 legacy stream"), HasSubstr("reads"),
                                     HasSubstr("not ordered after launch 'fill' on sim:0 stream")));
}

TEST(SimDeviceTest, MissingEventWaitBetweenCopyAndKernelIsNamed) {
  for (const bool waits : {true, false}) {
    auto sim = make_sim({.max_delay_us = 50});
    const Stream copies = new_stream(*sim, StreamFlags::kNonBlocking);
    const Stream compute = new_stream(*sim, StreamFlags::kNonBlocking);
    float* x = device_floats(*sim, 32, copies);
    float* y = device_floats(*sim, 32, compute);
    void* pinned = sim->allocate_pinned(32 * 4).value();
    std::fill_n(static_cast<float*>(pinned), 32, 41.0f);
    ASSERT_TRUE(sim->copy_async(x, pinned, 32 * 4, copies).ok());
    const Event copied = sim->create_event(0).value();
    ASSERT_TRUE(sim->record(copied, copies).ok());
    if (waits) {
      ASSERT_TRUE(sim->wait(compute, copied).ok());
    }
    const absl::Status launched = sim->launch(compute, add_one(y, x, 32));
    if (waits) {
      ASSERT_TRUE(launched.ok()) << launched;
      ASSERT_TRUE(sim->synchronize(compute).ok());
      EXPECT_EQ(read_back(*sim, y, 32), std::vector<float>(32, 42.0f));
      EXPECT_TRUE(sim->free_pinned(pinned).ok());
    } else {
      EXPECT_EQ(launched.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(launched.ToString(),
                  AllOf(HasSubstr("launch 'add_one' on sim:0 stream"), HasSubstr("reads bytes [0, 128)"),
                        HasSubstr("not ordered after copy_async of 128 bytes on sim:0 stream")));
      EXPECT_EQ(sim->synchronize_device(0), launched);  // sticky
    }
  }
}

TEST(SimDeviceTest, AnEventWaitSeesTheRecordAsOfTheCallOnly) {
  auto sim = make_sim();
  const Stream producer = new_stream(*sim, StreamFlags::kNonBlocking);
  const Stream consumer = new_stream(*sim, StreamFlags::kNonBlocking);
  float* a = device_floats(*sim, 8, producer);
  float* b = device_floats(*sim, 8, producer);
  float* out = device_floats(*sim, 8, producer);
  const Event e = sim->create_event(0).value();
  ASSERT_TRUE(sim->launch(producer, fill(a, 8, 1)).ok());
  ASSERT_TRUE(sim->launch(producer, fill(out, 8, 0)).ok());
  ASSERT_TRUE(sim->record(e, producer).ok());
  ASSERT_TRUE(sim->wait(consumer, e).ok());  // orders after fill(a), never after what comes later
  ASSERT_TRUE(sim->launch(producer, fill(b, 8, 2)).ok());
  ASSERT_TRUE(sim->record(e, producer).ok());  // too late for the wait above
  EXPECT_TRUE(sim->launch(consumer, add_one(out, a, 8)).ok());
  const absl::Status late = sim->launch(consumer, add_one(out, b, 8));
  EXPECT_THAT(late.ToString(), AllOf(HasSubstr("launch 'add_one'"), HasSubstr("not ordered after launch 'fill'")));
}

TEST(SimDeviceTest, FreeBeforeTheStreamUsingTheBlockFinishedIsNamed) {
  auto sim = make_sim();
  const Stream s = new_stream(*sim, StreamFlags::kNonBlocking);
  float* x = device_floats(*sim, 16);
  ASSERT_TRUE(sim->synchronize_device(0).ok());
  ASSERT_TRUE(sim->launch(s, fill(x, 16, 1)).ok());
  const absl::Status freed = sim->free(x, Stream::legacy(0));
  EXPECT_THAT(freed.ToString(), AllOf(HasSubstr("free of 256 bytes on sim:0 legacy stream"),
                                      HasSubstr("not ordered after launch 'fill' on sim:0 stream")));
  // Sticky: a free's caller (often a destructor) may drop the status, and the next call reports it.
  EXPECT_EQ(sim->synchronize_device(0), freed);
}

TEST(SimDeviceTest, FreeOrderedByAnEventIsClean) {
  auto sim = make_sim({.max_delay_us = 100});
  const Stream s = new_stream(*sim, StreamFlags::kNonBlocking);
  float* x = device_floats(*sim, 16);
  const Event allocated = sim->create_event(0).value();
  ASSERT_TRUE(sim->record(allocated, Stream::legacy(0)).ok());
  ASSERT_TRUE(sim->wait(s, allocated).ok());
  ASSERT_TRUE(sim->launch(s, fill(x, 16, 1)).ok());
  const Event used = sim->create_event(0).value();
  ASSERT_TRUE(sim->record(used, s).ok());
  ASSERT_TRUE(sim->wait(Stream::legacy(0), used).ok());
  EXPECT_TRUE(sim->free(x, Stream::legacy(0)).ok());
  EXPECT_TRUE(sim->synchronize_device(0).ok());
}

TEST(SimDeviceTest, AFreedBlockIsQuarantinedBeforeReuse) {
  auto quarantining = make_sim({.quarantine_bytes = 1 << 20});
  float* x = device_floats(*quarantining, 64);
  ASSERT_TRUE(quarantining->free(x, Stream::legacy(0)).ok());
  ASSERT_TRUE(quarantining->synchronize_device(0).ok());
  EXPECT_NE(device_floats(*quarantining, 64), x);

  auto reusing = make_sim({.quarantine_bytes = 0});
  float* y = device_floats(*reusing, 64);
  ASSERT_TRUE(reusing->free(y, Stream::legacy(0)).ok());
  ASSERT_TRUE(reusing->synchronize_device(0).ok());
  EXPECT_EQ(device_floats(*reusing, 64), y);  // the same block, and so the quarantine above is what moved it
}

TEST(SimDeviceTest, LaunchesCheckTheCurrentDeviceAndTheirPointers) {
  auto sim = make_sim();
  ASSERT_TRUE(sim->set_current_device(1).ok());
  float* on_one = device_floats(*sim, 4, Stream::legacy(1));
  ASSERT_TRUE(sim->set_current_device(0).ok());
  float* on_zero = device_floats(*sim, 4);
  const absl::Status other_stream = sim->launch(Stream::legacy(1), fill(on_one, 4, 1));
  EXPECT_THAT(other_stream.ToString(), HasSubstr("current device is sim:0: set_current_device(1) first"));
  const absl::Status other_memory = sim->launch(Stream::legacy(0), add_one(on_zero, on_one, 4));
  EXPECT_THAT(other_memory.ToString(),
              AllOf(HasSubstr("launch of 'add_one' on sim:0 legacy stream"), HasSubstr("memory of sim:1")));
  float host[4] = {};
  EXPECT_THAT(sim->launch(Stream::legacy(0), fill(host, 4, 1)).ToString(),
              HasSubstr("not inside a live allocation of the device"));
  EXPECT_EQ(sim->set_current_device(8).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SimDeviceTest, CopyAsyncRefusesPageableHostMemory) {
  auto sim = make_sim();
  float* x = device_floats(*sim, 4);
  float pageable[4] = {};
  EXPECT_THAT(sim->copy_async(x, pageable, sizeof(pageable), Stream::legacy(0)).ToString(),
              HasSubstr("pageable host memory: use allocate_pinned"));
}

TEST(SimDeviceTest, FreeingPinnedMemoryACopyStillReadsIsNamed) {
  auto sim = make_sim();
  const Stream s = new_stream(*sim, StreamFlags::kNonBlocking);
  float* x = device_floats(*sim, 4, s);
  void* pinned = sim->allocate_pinned(16).value();
  ASSERT_TRUE(sim->copy_async(x, pinned, 16, s).ok());
  EXPECT_THAT(sim->free_pinned(pinned).ToString(),
              AllOf(HasSubstr("free_pinned"), HasSubstr("not ordered after copy_async of 16 bytes")));
}

TEST(SimDeviceTest, ABodyReachingUndeclaredMemoryFailsAndTheErrorSticks) {
  auto sim = make_sim();
  float* x = device_floats(*sim, 4);
  float* y = device_floats(*sim, 4);
  KernelLaunch sneaky = fill(x, 4, 1);
  sneaky.accesses = {{y, 16, true}};                                    // declares y, writes x
  ASSERT_TRUE(sim->launch(Stream::legacy(0), std::move(sneaky)).ok());  // found when it runs
  const absl::Status synced = sim->synchronize_device(0);
  EXPECT_THAT(synced.ToString(), AllOf(HasSubstr("launch 'fill'"), HasSubstr("did not declare")));
  EXPECT_EQ(sim->launch(Stream::legacy(0), fill(y, 4, 1)).message(), synced.message());
}

TEST(SimDeviceTest, WithTheCheckerOffThePlantedBugsGoUnreported) {
  // The host memory itself is ordered by `filled`, which the checker cannot see, so that the kernels do not
  // race in fact (ThreadSanitizer would rightly say they did): to the streams' order they are still unordered.
  // Declared before the device, whose stream threads read it until its destructor joins them.
  std::atomic<bool> filled = false;
  // The checker is what finds them: the same calls as the tests above, none refused.
  auto sim = make_sim({.check_order = false});
  const Stream a = new_stream(*sim, StreamFlags::kNonBlocking);
  const Stream b = new_stream(*sim, StreamFlags::kNonBlocking);
  float* x = device_floats(*sim, 16, a);
  float* y = device_floats(*sim, 16, b);
  KernelLaunch write = fill(x, 16, 1);
  write.body = [body = write.body, &filled](const LaunchContext& ctx) {
    const absl::Status written = body(ctx);
    filled.store(true);
    return written;
  };
  KernelLaunch read = add_one(y, x, 16);
  read.body = [body = read.body, &filled](const LaunchContext& ctx) {
    while (!filled.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return body(ctx);
  };
  EXPECT_TRUE(sim->launch(a, std::move(write)).ok());
  EXPECT_TRUE(sim->launch(b, std::move(read)).ok());  // no wait
  EXPECT_TRUE(sim->free(x, b).ok());                  // not ordered after a's fill
  EXPECT_TRUE(sim->synchronize_device(0).ok());
  EXPECT_EQ(read_back(*sim, y, 16), std::vector<float>(16, 2.0f));
}

TEST(SimDeviceTest, HostThreadsHaveTheirOwnCurrentDeviceAndSynchronizationOrdersThem) {
  auto sim = make_sim();
  const Stream s = new_stream(*sim, StreamFlags::kNonBlocking, 2);
  std::thread other([&] {
    ASSERT_TRUE(sim->set_current_device(2).ok());
    EXPECT_EQ(sim->current_device(), 2);
  });
  other.join();
  EXPECT_EQ(sim->current_device(), 0);
  ASSERT_TRUE(sim->set_current_device(2).ok());
  float* x = device_floats(*sim, 8, s);
  ASSERT_TRUE(sim->launch(s, fill(x, 8, 9)).ok());
  ASSERT_TRUE(sim->synchronize(s).ok());  // the host now orders the legacy stream's next copy after the fill
  EXPECT_EQ(read_back(*sim, x, 8), std::vector<float>(8, 9.0f));
}

// A launch writing nothing that runs until `go` is set: work another thread can still queue behind.
KernelLaunch gated(float* out, const std::atomic<bool>& go) {
  return {"gated", {{out, 4, true}}, [&go](const LaunchContext&) {
            while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            return absl::OkStatus();
          }};
}

// Whether thread `tid` of this process sleeps (in synchronize: nothing else it runs blocks).
bool sleeping(pid_t tid) {
  std::ifstream stat(absl::StrCat("/proc/self/task/", tid, "/stat"));
  const std::string line(std::istreambuf_iterator<char>(stat), {});
  const size_t name_end = line.rfind(')');  // the state follows the name in parentheses
  return name_end != std::string::npos && line.substr(name_end + 2, 1) == "S";
}

TEST(SimDeviceTest, SynchronizeWaitsForTheWorkAsOfTheCallOnly) {
  // cudaEventSynchronize and cudaStreamSynchronize wait for the record, or the work, there when they are called:
  // what another thread queues meanwhile is not theirs to wait for.
  for (const bool event : {true, false}) {
    // Declared before the device: its stream threads read the gates until its destructor joins them.
    std::atomic<bool> first = false, second = false, returned = false;
    auto sim = make_sim();
    const Stream a = new_stream(*sim, StreamFlags::kNonBlocking);
    const Stream b = new_stream(*sim, StreamFlags::kNonBlocking);
    float* x = device_floats(*sim, 1, a);
    float* y = device_floats(*sim, 1, b);
    std::atomic<pid_t> tid = 0;
    const Event e = sim->create_event(0).value();
    ASSERT_TRUE(sim->launch(a, gated(x, first)).ok());
    ASSERT_TRUE(sim->record(e, a).ok());
    std::thread waiter([&] {
      tid = gettid();
      EXPECT_TRUE((event ? sim->synchronize(e) : sim->synchronize(a)).ok());
      returned = true;
    });
    while (tid == 0 || !sleeping(tid)) std::this_thread::yield();  // it waits for the gated launch now
    if (event) {
      ASSERT_TRUE(sim->launch(b, gated(y, second)).ok());
      ASSERT_TRUE(sim->record(e, b).ok());
      for (int i = 0; i < 64; ++i) ASSERT_TRUE(sim->create_event(0).ok());  // the event table grows
    } else {
      ASSERT_TRUE(sim->launch(a, gated(x, second)).ok());
    }
    first = true;
    for (int i = 0; i < 10000 && !returned; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(returned) << (event ? "synchronize(event)" : "synchronize(stream)") << " waits for later work";
    second = true;
    waiter.join();
  }
}

TEST(SimDeviceTest, ACopyToDeviceMemoryOrdersTheHostOnlyFromPinnedMemory) {
  // cudaMemcpy may return before a copy from pageable memory, or from device memory, reached its destination
  // (only the staging is done, or nothing is): a non-blocking stream reading it must wait for the legacy stream.
  for (const std::string source : {"pinned", "pageable", "device"}) {
    SCOPED_TRACE(source);
    auto sim = make_sim();
    const Stream s = new_stream(*sim, StreamFlags::kNonBlocking);
    float* x = device_floats(*sim, 4);
    float* y = device_floats(*sim, 4);
    float* z = device_floats(*sim, 4);
    float pageable[4] = {1, 2, 3, 4};
    void* pinned = sim->allocate_pinned(16).value();
    std::memcpy(pinned, pageable, 16);
    ASSERT_TRUE(sim->copy(z, pageable, 16).ok());
    ASSERT_TRUE(sim->synchronize_device(0).ok());  // the allocations and z, before s uses them
    const void* from = source == "pinned" ? pinned : source == "pageable" ? pageable : z;
    ASSERT_TRUE(sim->copy(x, from, 16).ok());
    const absl::Status read = sim->launch(s, add_one(y, x, 4));
    if (source == "pinned") {
      EXPECT_TRUE(read.ok()) << read;
      ASSERT_TRUE(sim->synchronize(s).ok());
      EXPECT_EQ(read_back(*sim, y, 4), std::vector<float>({2, 3, 4, 5}));
    } else {
      EXPECT_THAT(read.ToString(), AllOf(HasSubstr("launch 'add_one' on sim:0 stream 1 (#1) reads bytes [0, 16)"),
                                         HasSubstr("not ordered after copy of 16 bytes on sim:0 legacy stream")));
    }
  }
}

// What blocks a host thread counts for it: synchronizations and copies that touch device memory; queued work,
// queries and host-to-host copies do not, nor another thread's waits.
TEST(SimDeviceTest, HostSynchronizationsAreCountedPerHostThread) {
  auto sim = make_sim();
  const Stream s = new_stream(*sim, StreamFlags::kNonBlocking);
  absl::StatusOr<Event> e = sim->create_event(0);
  ASSERT_TRUE(e.ok());
  float* x = device_floats(*sim, 4, s);
  const uint64_t before = sim->host_synchronizations();
  ASSERT_TRUE(sim->launch(s, fill(x, 4, 1)).ok());
  ASSERT_TRUE(sim->record(*e, s).ok());
  ASSERT_TRUE(sim->query(*e).ok());
  float a[4] = {}, b[4] = {};
  ASSERT_TRUE(sim->copy(a, b, sizeof(a)).ok());
  EXPECT_EQ(sim->host_synchronizations(), before);
  ASSERT_TRUE(sim->synchronize(*e).ok());
  ASSERT_TRUE(sim->synchronize(s).ok());
  ASSERT_TRUE(sim->synchronize_device(0).ok());
  ASSERT_TRUE(sim->copy(a, x, sizeof(a)).ok());
  EXPECT_EQ(sim->host_synchronizations(), before + 4);
  std::thread([&] {
    EXPECT_EQ(sim->host_synchronizations(), 0u);
    EXPECT_TRUE(sim->synchronize_device(0).ok());
    EXPECT_EQ(sim->host_synchronizations(), 1u);
  }).join();
  EXPECT_EQ(sim->host_synchronizations(), before + 4);
}

TEST(SimDeviceTest, ANewHostThreadStartsOnDeviceZero) {
  // As with cudaSetDevice: a thread's current device (and what it synchronized with) is its own, never that of an
  // ended thread whose std::thread::id it happens to get.
  auto sim = make_sim();
  for (int i = 0; i < 20; ++i) {
    std::thread([&] { ASSERT_TRUE(sim->set_current_device(3).ok()); }).join();
    int seen = -1;
    std::thread([&] { seen = sim->current_device(); }).join();
    ASSERT_EQ(seen, 0) << "thread " << i;
  }
}

TEST(SimDeviceTest, TheAllocationWritesItsWholeBlock) {
  // A launch may reach all of the block (its bytes rounded up to 256): another stream must be ordered after the
  // allocation there too.
  auto sim = make_sim();
  const Stream s = new_stream(*sim, StreamFlags::kNonBlocking);
  float* x = device_floats(*sim, 4);
  EXPECT_THAT(sim->launch(s, fill(x + 32, 32, 1)).ToString(),
              AllOf(HasSubstr("launch 'fill' on sim:0 stream 1 (#1) writes bytes [128, 256)"),
                    HasSubstr("not ordered after allocate of 16 bytes on sim:0 legacy stream (#1), which writes "
                              "bytes [0, 256)")));
}

TEST(SimDeviceTest, SizesThatWrapAroundAreRefused) {
  // n * 4 for n = -1 is 2^64 - 4: rounded up to 256 it wraps to 0, and added to an address it wraps below it.
  auto sim = make_sim();
  const absl::StatusOr<void*> device = sim->allocate(SIZE_MAX - 3, Stream::legacy(0));
  EXPECT_EQ(device.status().code(), absl::StatusCode::kResourceExhausted) << device.status();
  const absl::StatusOr<void*> pinned = sim->allocate_pinned(SIZE_MAX - 3);
  EXPECT_EQ(pinned.status().code(), absl::StatusCode::kResourceExhausted) << pinned.status();
  float* x = device_floats(*sim, 4);
  EXPECT_THAT(sim->launch(Stream::legacy(0), {"huge", {{x, SIZE_MAX - 3, true}}, nullptr}).ToString(),
              HasSubstr("which is not inside a live allocation of the device"));
  KernelLaunch reaching = fill(x, 4, 1);
  reaching.body = [x](const LaunchContext& ctx) { return ctx.host_pointer(x + 1, SIZE_MAX - 3).status(); };
  ASSERT_TRUE(sim->launch(Stream::legacy(0), std::move(reaching)).ok());
  EXPECT_THAT(sim->synchronize_device(0).ToString(), HasSubstr("which its launch did not declare"));
}

size_t virtual_memory_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmSize:")) return std::stoul(line.substr(7));
  }
  return 0;
}

TEST(SimDeviceTest, ADestroyedStreamsThreadIsJoinedOnceItsWorkRan) {
  // A program making a stream per step must not keep a thread (and its stack) per step until the device goes.
  mallopt(M_ARENA_MAX, 1);  // new threads' malloc arenas (64 MiB of address space each) would hide what is measured
  auto sim = make_sim();
  const size_t before = virtual_memory_kib();
  const auto churn = [&] { ASSERT_TRUE(sim->destroy_stream(new_stream(*sim, StreamFlags::kNonBlocking)).ok()); };
  for (int i = 0; i < 100; ++i) churn();
  // A worker ends a moment after its stream is destroyed, and a later destroy_stream joins it.
  for (int i = 0; i < 1000 && virtual_memory_kib() > before + 100 * 1024; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    churn();
  }
  EXPECT_LE(virtual_memory_kib(), before + 100 * 1024) << "KiB before: " << before;
}

TEST(SimDeviceTest, ACopyOfNoBytesMayNameNullPointers) {
  // An empty tensor's data is null; cudaMemcpy of 0 bytes accepts it (memmove does not: UBSan's nonnull check).
  auto sim = make_sim();
  float* x = device_floats(*sim, 4);
  EXPECT_TRUE(sim->copy(x, nullptr, 0).ok());
  EXPECT_TRUE(sim->copy(nullptr, x, 0).ok());
  EXPECT_TRUE(sim->copy(nullptr, nullptr, 0).ok());
}

TEST(SimDeviceTest, ABlockLargerThanTheQuarantineStillWaitsBehindLaterFrees) {
  // ZeRO's flat buffers are larger than the quarantine: freed, one must not come straight back as the next tensor.
  auto sim = make_sim({.quarantine_bytes = 1 << 20});
  float* big = device_floats(*sim, 1 << 19);  // 2 MiB
  ASSERT_TRUE(sim->free(big, Stream::legacy(0)).ok());
  ASSERT_TRUE(sim->synchronize_device(0).ok());
  float* next = device_floats(*sim, 1 << 19);
  EXPECT_NE(next, big);
  ASSERT_TRUE(sim->free(next, Stream::legacy(0)).ok());  // 2 MiB of later frees: `big` may come back now
  ASSERT_TRUE(sim->synchronize_device(0).ok());
  EXPECT_EQ(device_floats(*sim, 1 << 19), big);
}

}  // namespace
}  // namespace zero::sim
