// A worker thread that runs tasks in submission order: the CPU analogue of a CUDA stream.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace zero {

class CpuStream {
 public:
  explicit CpuStream(std::string name);
  // Runs what was submitted, then joins.
  ~CpuStream();
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  void submit(std::function<void()> task);
  // Blocks until every task submitted so far has run.
  void synchronize();

 private:
  void loop();

  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t submitted_ = 0;
  uint64_t finished_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace zero
