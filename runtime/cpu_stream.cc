#include "runtime/cpu_stream.h"

#include <pthread.h>

namespace zero {

CpuStream::CpuStream(std::string name) : name_(std::move(name)), thread_([this] { loop(); }) {
  pthread_setname_np(thread_.native_handle(), name_.substr(0, 15).c_str());
}

CpuStream::~CpuStream() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void CpuStream::submit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  ++submitted_;
}

void CpuStream::synchronize() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = submitted_;
  const auto caught_up = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ >= target; };
  mu_.Await(absl::Condition(&caught_up));
}

void CpuStream::loop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &CpuStream::has_task_or_stopping));
      if (queue_.empty()) return;  // stopping, and everything ran
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
    task = nullptr;  // what it captured goes before synchronize() can return
    absl::MutexLock lock(&mu_);
    ++finished_;
  }
}

}  // namespace zero
