// A worker thread that runs tasks in submission order: the CPU analogue of a CUDA stream.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace zero {

// Thread-safe: submit and synchronize may be called from any threads; tasks run one at a time on the
// stream's own thread, in the order their submits took the lock. Nothing may be submitted once the
// destructor has begun.
class CpuStream {
 public:
  explicit CpuStream(std::string name);
  // Runs what was submitted, then joins.
  ~CpuStream();
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  void submit(std::function<void()> task);
  // Blocks until every task submitted so far has run (and been destroyed, with what it captured).
  void synchronize();

 private:
  void loop();
  bool has_task_or_stopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); }

  const std::string name_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace zero
