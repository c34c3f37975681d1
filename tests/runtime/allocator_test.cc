#include "runtime/allocator.h"

#include <fcntl.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "runtime/device_memory.h"
#include "runtime/file_memory.h"
#include "runtime/sim/sim_device.h"
#include "tests/failing_files.h"
#include "tests/temp_dir.h"

namespace zero {
namespace {

using ::testing::HasSubstr;

TEST(Allocator, TracksCurrentAndPeakPerCategory) {
  Allocator alloc(/*rank=*/0);
  {
    absl::StatusOr<Buffer> params = alloc.allocate(1000, MemoryCategory::kParams);
    ASSERT_TRUE(params.ok());
    {
      absl::StatusOr<Buffer> grads = alloc.allocate(300, MemoryCategory::kGrads);
      ASSERT_TRUE(grads.ok());
      EXPECT_EQ(alloc.stats().current_of(MemoryCategory::kGrads), 300);
      EXPECT_EQ(alloc.stats().current_total, 1300);
    }
    const MemoryStats s = alloc.stats();
    EXPECT_EQ(s.current_of(MemoryCategory::kGrads), 0);
    EXPECT_EQ(s.peak_of(MemoryCategory::kGrads), 300);
    EXPECT_EQ(s.current_of(MemoryCategory::kParams), 1000);
    EXPECT_EQ(s.peak_total, 1300);
    EXPECT_EQ(s.current_total, 1000);
  }
  EXPECT_EQ(alloc.stats().current_total, 0);
}

TEST(Allocator, CpuMemoryIs64ByteAligned) {
  Allocator alloc;
  for (int64_t n : {1, 3, 64, 100, 4097}) {
    absl::StatusOr<Buffer> b = alloc.allocate(n, MemoryCategory::kWorkspace);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 64, 0u) << n;
  }
}

TEST(Allocator, BudgetBreachNamesCategoryRequestAndHoldings) {
  Allocator alloc(/*rank=*/3, /*budget_bytes=*/4096);
  absl::StatusOr<Buffer> params = alloc.allocate(3000, MemoryCategory::kParams);
  ASSERT_TRUE(params.ok());
  absl::StatusOr<Buffer> state = alloc.allocate(2000, MemoryCategory::kOptimizerState);
  ASSERT_FALSE(state.ok());
  EXPECT_TRUE(is_out_of_memory(state.status()));
  const std::string msg(state.status().message());
  EXPECT_THAT(msg, HasSubstr("rank 3"));
  EXPECT_THAT(msg, HasSubstr("optimizer_state asked for 1.95 KiB (2000 bytes)"));
  EXPECT_THAT(msg, HasSubstr("budget is 4.00 KiB"));
  EXPECT_THAT(msg, HasSubstr("params 2.93 KiB"));
  // The refused request left the accounting as it was, and what fits still fits.
  EXPECT_EQ(alloc.stats().current_total, 3000);
  EXPECT_EQ(alloc.stats().peak_total, 3000);
  EXPECT_TRUE(alloc.allocate(1096, MemoryCategory::kOptimizerState).ok());
}

// A device engine's budget bounds the device's memory; its host memory is counted beside it, not bounded.
TEST(Allocator, ABudgetOfADeviceBoundsThatDeviceAlone) {
  Allocator alloc(/*rank=*/0, /*budget_bytes=*/4096, DeviceType::kSim);
  absl::StatusOr<Buffer> params = alloc.allocate(3000, MemoryCategory::kParams, Device::sim(0));
  ASSERT_TRUE(params.ok()) << params.status();
  absl::StatusOr<Buffer> state = alloc.allocate(8000, MemoryCategory::kOptimizerState);  // host memory
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(alloc.stats().current_total, 11000);
  absl::StatusOr<Buffer> grads = alloc.allocate(2000, MemoryCategory::kGrads, Device::sim(0));
  ASSERT_FALSE(grads.ok());
  EXPECT_THAT(std::string(grads.status().message()), HasSubstr("the budget is 4.00 KiB and 2.93 KiB of it is held"));
  params->reset();
  EXPECT_TRUE(alloc.allocate(4096, MemoryCategory::kGrads, Device::sim(0)).ok());
}

TEST(Allocator, PinnedHostMemoryIsCountedApartFromDeviceMemoryAndFreedByItsApi) {
  absl::StatusOr<std::unique_ptr<sim::SimDevice>> sim = sim::SimDevice::create();
  ASSERT_TRUE(sim.ok()) << sim.status();
  const int64_t big = int64_t{256} << 10;  // a size the host cache would keep, were it pageable
  Allocator alloc(/*rank=*/0, /*budget_bytes=*/1000, DeviceType::kSim);
  absl::StatusOr<Buffer> params = alloc.allocate(1000, MemoryCategory::kParams, Device::sim(0));
  absl::StatusOr<Buffer> pinned = alloc.allocate_pinned(**sim, big, MemoryCategory::kCommBuffers);  // not budgeted
  absl::StatusOr<Buffer> host = alloc.allocate(500, MemoryCategory::kWorkspace);
  ASSERT_TRUE(params.ok() && pinned.ok() && host.ok()) << pinned.status();
  EXPECT_TRUE(pinned->device().is_cpu());
  EXPECT_EQ(alloc.stats().current_total, 1500 + big);
  EXPECT_EQ(alloc.stats().current_of(MemoryCategory::kCommBuffers), big);
  EXPECT_EQ(alloc.stats().device_current, 1000);
  EXPECT_EQ(alloc.stats().pinned_current, big);
  EXPECT_THAT(alloc.summary(), HasSubstr("pinned"));

  void* const data = pinned->data();
  pinned->reset();
  EXPECT_FALSE((*sim)->free_pinned(data).ok()) << "the buffer did not give its memory back to the API";
  const MemoryStats after = alloc.stats();
  EXPECT_EQ(after.pinned_current, 0);
  EXPECT_EQ(after.pinned_peak, big);
  EXPECT_EQ(after.cached, 0) << "page-locked memory is not kept for pageable allocations";
  EXPECT_EQ(after.current_total, 1500);
  alloc.reset_peaks();
  EXPECT_EQ(alloc.stats().pinned_peak, 0);
  EXPECT_EQ(alloc.stats().device_peak, 1000);
}

TEST(Allocator, OtherFailuresAreNotOutOfMemory) {
  EXPECT_FALSE(is_out_of_memory(absl::ResourceExhaustedError("something else")));
  EXPECT_FALSE(is_out_of_memory(absl::OkStatus()));
}

TEST(Allocator, ZeroByteAllocationsAreAccountedAsNothing) {
  Allocator alloc(0, /*budget_bytes=*/0);
  absl::StatusOr<Buffer> b = alloc.allocate(0, MemoryCategory::kActivations);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->nbytes(), 0);
  EXPECT_EQ(alloc.stats().peak_total, 0);
}

TEST(Allocator, NegativeSizeIsRejected) {
  Allocator alloc;
  EXPECT_TRUE(absl::IsInvalidArgument(alloc.allocate(-1, MemoryCategory::kParams).status()));
}

TEST(Allocator, MovedBufferIsFreedOnce) {
  Allocator alloc;
  Buffer a = std::move(alloc.allocate(128, MemoryCategory::kCommBuffers)).value();
  Buffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(alloc.stats().current_total, 128);
  b.reset();
  EXPECT_EQ(alloc.stats().current_total, 0);
}

TEST(Allocator, ResetPeaksStartsFromWhatIsHeld) {
  Allocator alloc;
  Buffer kept = std::move(alloc.allocate(100, MemoryCategory::kParams)).value();
  { Buffer tmp = std::move(alloc.allocate(500, MemoryCategory::kWorkspace)).value(); }
  alloc.reset_peaks();
  EXPECT_EQ(alloc.stats().peak_total, 100);
  EXPECT_EQ(alloc.stats().peak_of(MemoryCategory::kWorkspace), 0);
}

TEST(Allocator, ConcurrentAllocationsNeverExceedTheBudget) {
  constexpr int64_t kBudget = 64 * 1000;
  Allocator alloc(0, kBudget);
  std::vector<std::thread> threads;
  std::vector<std::vector<Buffer>> held(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) {
        absl::StatusOr<Buffer> b = alloc.allocate(64, MemoryCategory::kActivations);
        if (b.ok()) held[t].push_back(std::move(*b));
      }
    });
  }
  for (auto& t : threads) t.join();
  size_t granted = 0;
  for (auto& h : held) granted += h.size();
  EXPECT_EQ(granted, 1000u);  // exactly the budget's worth, out of 4000 requests
  EXPECT_EQ(alloc.stats().peak_total, kBudget);
}

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(AllocatorCache, FreedHostBlockIsReusedByTheNextAllocationOfItsSize) {
  Allocator alloc;
  Buffer other_size = std::move(alloc.allocate(2 * kMiB, MemoryCategory::kCommBuffers)).value();
  void* first = nullptr;
  {
    Buffer gathered = std::move(alloc.allocate(3 * kMiB, MemoryCategory::kCommBuffers)).value();
    first = gathered.data();
  }
  EXPECT_EQ(alloc.stats().cached, 3 * kMiB);
  EXPECT_EQ(alloc.stats().current_total, 2 * kMiB);
  EXPECT_THAT(alloc.summary(), HasSubstr("3.00 MiB freed, kept for reuse"));
  // Any category may take it: it is accounted to the new one.
  Buffer again = std::move(alloc.allocate(3 * kMiB, MemoryCategory::kActivations)).value();
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(alloc.stats().cached, 0);
  EXPECT_EQ(alloc.stats().current_of(MemoryCategory::kActivations), 3 * kMiB);
}

TEST(AllocatorCache, KeptBlocksNeverExceedTheMostHeldAtOnce) {
  Allocator alloc;
  { Buffer a = std::move(alloc.allocate(3 * kMiB, MemoryCategory::kCommBuffers)).value(); }
  { Buffer b = std::move(alloc.allocate(1 * kMiB, MemoryCategory::kCommBuffers)).value(); }
  // 4 MiB kept would exceed the 3 MiB this rank ever held at once: the oldest block goes.
  EXPECT_EQ(alloc.stats().cached, 1 * kMiB);
  EXPECT_EQ(alloc.stats().peak_total, 3 * kMiB);
}

TEST(AllocatorCache, HeldPlusKeptStaysWithinTheBudget) {
  Allocator alloc(0, 4 * kMiB);
  { Buffer a = std::move(alloc.allocate(3 * kMiB, MemoryCategory::kCommBuffers)).value(); }
  EXPECT_EQ(alloc.stats().cached, 3 * kMiB);
  Buffer b = std::move(alloc.allocate(2 * kMiB, MemoryCategory::kCommBuffers)).value();
  EXPECT_EQ(alloc.stats().cached, 0);
  b.reset();
  EXPECT_EQ(alloc.stats().cached, 2 * kMiB);
  alloc.set_budget(kMiB);
  EXPECT_EQ(alloc.stats().cached, 0);
}

TEST(AllocatorCache, SmallBlocksAreNotKept) {
  Allocator alloc;
  { Buffer small = std::move(alloc.allocate(64 << 10, MemoryCategory::kWorkspace)).value(); }
  EXPECT_EQ(alloc.stats().cached, 0);
}

TEST(Allocator, SummaryListsEveryCategory) {
  Allocator alloc(1, 1 << 20);
  Buffer b = std::move(alloc.allocate(2048, MemoryCategory::kMasterWeights)).value();
  const std::string s = alloc.summary();
  EXPECT_THAT(s, HasSubstr("rank 1 memory (budget 1.00 MiB)"));
  EXPECT_THAT(s, HasSubstr("master_weights"));
  EXPECT_THAT(s, HasSubstr("2.00 KiB"));
  for (int c = 0; c < kNumMemoryCategories; ++c)
    EXPECT_THAT(s, HasSubstr(category_name(static_cast<MemoryCategory>(c))));
}

TEST(Allocator, CudaMemoryWithoutCudaIsAClearError) {
#ifdef ZERO_HAS_CUDA
  GTEST_SKIP() << "built with CUDA; covered by the CUDA tests";
#else
  Allocator alloc;
  absl::StatusOr<Buffer> b = alloc.allocate(16, MemoryCategory::kParams, Device::cuda(0));
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("built without CUDA"));
  EXPECT_EQ(alloc.stats().current_total, 0);
#endif
}

TEST(AllocatorFiles, CategoryPlacedInFilesKeepsItsValuesAcrossPageOutAndCountsOutsideTheBudget) {
  const testing::ScopedTempDir offload;
  const std::string dir = offload.path().string();
  Allocator alloc(0, 64 << 10);
  ASSERT_TRUE(alloc.place_in_files(MemoryCategory::kOptimizerState, dir).ok());
  constexpr int64_t kFloats = 1 << 16;  // 256 KiB: four times the budget
  Buffer state = std::move(alloc.allocate(kFloats * 4, MemoryCategory::kOptimizerState)).value();
  Buffer params = std::move(alloc.allocate(1024, MemoryCategory::kParams)).value();
  float* x = static_cast<float*>(state.data());
  for (int64_t i = 0; i < kFloats; ++i) EXPECT_EQ(x[i], 0.0f) << "file memory starts zeroed";
  for (int64_t i = 0; i < kFloats; ++i) x[i] = static_cast<float>(i) * 0.5f;
  ASSERT_TRUE(alloc.page_out(state.data()).ok());
  ASSERT_TRUE(alloc.page_out(params.data()).ok()) << "a RAM buffer has nothing to page out";
  ASSERT_TRUE(alloc.page_in(state.data()).ok());
  for (int64_t i = 0; i < kFloats; ++i) ASSERT_EQ(x[i], static_cast<float>(i) * 0.5f) << i;

  const MemoryStats stats = alloc.stats();
  EXPECT_EQ(stats.in_files_of(MemoryCategory::kOptimizerState), kFloats * 4);
  EXPECT_EQ(stats.current_of(MemoryCategory::kOptimizerState), 0);
  EXPECT_EQ(stats.current_total, 1024);
  EXPECT_THAT(alloc.summary(), HasSubstr("in files"));
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the files are unlinked as soon as they are made";
  state.reset();
  EXPECT_EQ(alloc.stats().in_files_of(MemoryCategory::kOptimizerState), 0);
}

TEST(AllocatorFiles, PageOutDropsTheBytesFromRamUntilPageInReadsThemBack) {
  const testing::ScopedTempDir offload;
  const std::string dir = offload.path().string();
  if (files_stay_in_ram(dir)) GTEST_SKIP() << dir << " is in RAM (tmpfs): paging out frees nothing there";
  Allocator alloc;
  ASSERT_TRUE(alloc.place_in_files(MemoryCategory::kOptimizerState, dir).ok());
  constexpr int64_t kFloats = (1 << 16) + 3;  // 64 pages of 4 KiB and 12 bytes more: a page partly used
  Buffer state = std::move(alloc.allocate(kFloats * 4, MemoryCategory::kOptimizerState)).value();
  float* x = static_cast<float*>(state.data());
  for (int64_t i = 0; i < kFloats; ++i) x[i] = 1.0f;
  EXPECT_EQ(alloc.file_bytes_in_ram(), 65 * 4096) << "every page was written";
  ASSERT_TRUE(alloc.page_out(state.data()).ok());
  EXPECT_EQ(alloc.file_bytes_in_ram(), 0);
  ASSERT_TRUE(alloc.page_out(state.data()).ok()) << "paging out what is out does nothing";
  ASSERT_TRUE(alloc.page_in(state.data()).ok());
  EXPECT_EQ(alloc.file_bytes_in_ram(), 65 * 4096);
  EXPECT_EQ(x[kFloats - 1], 1.0f);
}

TEST(AllocatorFiles, TouchingPagedOutMemoryIsACrashNeverASilentZero) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const testing::ScopedTempDir offload;
  // The death test runs this body again in a child, which dies holding an offload directory of its own: made inside
  // this one (the child's temporary directory), it is removed with this one.
  const char* outer = getenv("TEST_TMPDIR");
  const std::optional<std::string> saved = outer != nullptr ? std::optional<std::string>(outer) : std::nullopt;
  setenv("TEST_TMPDIR", offload.path().c_str(), /*overwrite=*/1);
  const absl::Cleanup restore = [&saved] {
    if (saved.has_value()) {
      setenv("TEST_TMPDIR", saved->c_str(), 1);
    } else {
      unsetenv("TEST_TMPDIR");
    }
  };
  Allocator alloc;
  ASSERT_TRUE(alloc.place_in_files(MemoryCategory::kOptimizerState, offload.path().string()).ok());
  Buffer state = std::move(alloc.allocate(4096, MemoryCategory::kOptimizerState)).value();
  ASSERT_TRUE(alloc.page_out(state.data()).ok());
  EXPECT_DEATH({ [[maybe_unused]] volatile float v = *static_cast<volatile float*>(state.data()); }, "");
}

TEST(AllocatorFiles, DropUnchangedLeavesTheFileAsItWas) {
  const testing::ScopedTempDir offload;
  Allocator alloc;
  ASSERT_TRUE(alloc.place_in_files(MemoryCategory::kOptimizerState, offload.path().string()).ok());
  Buffer state = std::move(alloc.allocate(3 * 4096, MemoryCategory::kOptimizerState)).value();
  float* x = static_cast<float*>(state.data());
  x[5] = 2.0f;
  ASSERT_TRUE(alloc.page_out(state.data()).ok());
  ASSERT_TRUE(alloc.page_in(state.data()).ok());
  x[5] = 3.0f;  // a change drop_unchanged's caller promised not to make: lost, as the contract says
  ASSERT_TRUE(alloc.drop_unchanged(state.data()).ok());
  EXPECT_EQ(alloc.file_bytes_in_ram(), 0);
  ASSERT_TRUE(alloc.page_in(state.data()).ok());
  EXPECT_EQ(x[5], 2.0f) << "the file holds what the last page_out wrote";
}

TEST(AllocatorFiles, AFailedTransferLosesNothingAndTheNextOneRetriesIt) {
  const testing::ScopedTempDir offload;
  const std::string dir = offload.path().string();
  Allocator alloc;
  ASSERT_TRUE(alloc.place_in_files(MemoryCategory::kOptimizerState, dir).ok());
  Buffer state = std::move(alloc.allocate(4096, MemoryCategory::kOptimizerState)).value();
  float* x = static_cast<float*>(state.data());
  x[1] = 1.0f;
  ASSERT_TRUE(alloc.page_out(state.data()).ok());
  {
    const testing::FailingFiles unreadable(testing::offload_fds(dir), O_WRONLY);
    const absl::Status read = alloc.page_in(state.data());
    EXPECT_THAT(std::string(read.message()), HasSubstr("cannot read an offload file"));
  }
  ASSERT_TRUE(alloc.page_in(state.data()).ok()) << "the failed read left the buffer out, so this reads it";
  x[1] = 2.0f;
  {
    const testing::FailingFiles unwritable(testing::offload_fds(dir), O_RDONLY);
    const absl::Status written = alloc.page_out(state.data());
    EXPECT_THAT(std::string(written.message()), HasSubstr("cannot write an offload file"));
  }
  EXPECT_EQ(x[1], 2.0f) << "a failed write leaves the memory in RAM, as it was";
  ASSERT_TRUE(alloc.drop_unchanged(state.data()).ok());
  ASSERT_TRUE(alloc.page_in(state.data()).ok());
  EXPECT_EQ(x[1], 2.0f) << "the file was stale after the failed write, so dropping wrote it after all";
}

TEST(AllocatorFiles, MoreThanTheDriveHoldsIsRefusedWhenAllocatedNamingTheDirectory) {
  const testing::ScopedTempDir offload;
  const std::string dir = offload.path().string();
  const std::filesystem::space_info space = std::filesystem::space(dir);
  Allocator alloc;
  ASSERT_TRUE(alloc.place_in_files(MemoryCategory::kOptimizerState, dir).ok());
  const int64_t too_much = static_cast<int64_t>(space.available) + (int64_t{1} << 30);
  absl::StatusOr<Buffer> b = alloc.allocate(too_much, MemoryCategory::kOptimizerState);
  ASSERT_FALSE(b.ok()) << "a sparse file would have been created, to fail at its first write-back";
  EXPECT_THAT(std::string(b.status().message()),
              HasSubstr(absl::StrCat("cannot reserve ", too_much, " bytes for a file in ", dir)));
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("bytes are free there"));
  EXPECT_EQ(alloc.stats().in_files_of(MemoryCategory::kOptimizerState), 0);
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST(AllocatorFiles, DirectoryThatCannotHoldFilesIsRefusedNamingIt) {
  Allocator alloc;
  const absl::Status status = alloc.place_in_files(MemoryCategory::kOptimizerState, "/nonexistent/nvme");
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("/nonexistent/nvme"));
  Buffer b = std::move(alloc.allocate(64, MemoryCategory::kOptimizerState)).value();
  EXPECT_EQ(alloc.stats().current_of(MemoryCategory::kOptimizerState), 64) << "placement unchanged";
}

TEST(CopyBytes, HostToHostCopiesAndCudaWithoutCudaIsAClearError) {
  const std::vector<float> src = {1.5f, -2.0f, 3.25f};
  std::vector<float> dst(3);
  ASSERT_TRUE(copy_bytes(dst.data(), Device::cpu(), src.data(), Device::cpu(), 12).ok());
  EXPECT_EQ(dst, src);
#ifndef ZERO_HAS_CUDA
  const absl::Status status = copy_bytes(dst.data(), Device::cuda(0), src.data(), Device::cpu(), 12);
  EXPECT_THAT(std::string(status.message()), HasSubstr("cuda:0: zero was built without CUDA"));
#endif
}

TEST(FormatBytes, BinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 30), "3.00 GiB");
}

}  // namespace
}  // namespace zero
