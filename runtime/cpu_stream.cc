#include "runtime/cpu_stream.h"

#include <pthread.h>

namespace zero {

CpuStream::CpuStream(std::string name) : name_(std::move(name)), thread_([this] { loop(); }) {
  pthread_setname_np(thread_.native_handle(), name_.substr(0, 15).c_str());
}

CpuStream::~CpuStream() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CpuStream::submit(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(task));
    ++submitted_;
  }
  cv_.notify_all();
}

void CpuStream::synchronize() {
  std::unique_lock lock(mu_);
  const uint64_t target = submitted_;
  cv_.wait(lock, [&] { return finished_ >= target; });
}

void CpuStream::loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything ran
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    lock.lock();
    ++finished_;
    cv_.notify_all();
  }
}

}  // namespace zero
