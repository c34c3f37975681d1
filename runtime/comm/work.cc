#include "runtime/comm/work.h"

namespace zero {

void WorkState::complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  status_ = std::move(status);
  done_ = true;
}

absl::Status WorkState::wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

bool WorkState::is_completed() {
  absl::MutexLock lock(&mu_);
  return done_;
}

Work Work::completed(absl::Status status) {
  auto state = std::make_shared<WorkState>();
  state->complete(std::move(status));
  return Work(std::move(state));
}

}  // namespace zero
