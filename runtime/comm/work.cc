#include "runtime/comm/work.h"

#include "runtime/device_memory.h"

namespace zero {

void WorkState::complete(absl::Status status, std::shared_ptr<const DeviceCompletion> on_device) {
  absl::MutexLock lock(&mu_);
  status_ = std::move(status);
  on_device_ = std::move(on_device);
  done_ = true;
}

absl::Status WorkState::wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  if (!on_device_) return status_;
  const Device device = on_device_->device;
  const absl::Status ordered = device_api(device)->wait(current_stream(device), on_device_->event.get());
  return status_.ok() ? ordered : status_;
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
