#include "runtime/cpu_stream.h"

#include <atomic>
#include <vector>

#include <gtest/gtest.h>

namespace zero {
namespace {

TEST(CpuStream, RunsTasksInSubmissionOrder) {
  std::vector<int> order;
  {
    CpuStream stream("test");
    for (int i = 0; i < 100; ++i) stream.submit([&order, i] { order.push_back(i); });
    stream.synchronize();
    ASSERT_EQ(order.size(), 100u);
  }
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(CpuStream, DestructorRunsWhatWasSubmitted) {
  std::atomic<int> ran = 0;
  {
    CpuStream stream("test");
    for (int i = 0; i < 10; ++i) stream.submit([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace zero
