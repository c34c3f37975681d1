// A handle to an asynchronous collective: wait for it, or ask whether it finished.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>

#include "absl/status/status.h"

namespace zero {

// Shared between the Work handles and the thread that completes the operation.
class WorkState {
 public:
  void complete(absl::Status status);
  absl::Status wait();
  bool is_completed();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
};

class Work {
 public:
  // An already finished operation with `status`.
  static Work completed(absl::Status status = absl::OkStatus());
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

  // Blocks until the operation finished (or failed: it fails on its own within the communicator's
  // timeout) and returns its status. Buffers may be reused only after wait() returned.
  absl::Status wait() const { return state_->wait(); }
  bool is_completed() const { return state_->is_completed(); }

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace zero
