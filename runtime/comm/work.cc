#include "runtime/comm/work.h"

namespace zero {

void WorkState::complete(absl::Status status) {
  {
    std::lock_guard lock(mu_);
    status_ = std::move(status);
    done_ = true;
  }
  cv_.notify_all();
}

absl::Status WorkState::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return status_;
}

bool WorkState::is_completed() {
  std::lock_guard lock(mu_);
  return done_;
}

Work Work::completed(absl::Status status) {
  auto state = std::make_shared<WorkState>();
  state->complete(std::move(status));
  return Work(std::move(state));
}

}  // namespace zero
