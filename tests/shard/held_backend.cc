#include "tests/shard/held_backend.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

namespace zero::testing {

void EventLog::add(std::string event) {
  std::lock_guard lock(mu_);
  events_.push_back(std::move(event));
}

std::vector<std::string> EventLog::events() const {
  std::lock_guard lock(mu_);
  return events_;
}

void HeldBackend::arm() {
  std::lock_guard lock(mu_);
  armed_ = true;
}

bool HeldBackend::awaits_release() {
  std::lock_guard lock(mu_);
  return armed_ && !released_;
}

void HeldBackend::release() {
  std::lock_guard lock(mu_);
  released_ = true;
  cv_.notify_all();
}

absl::Status HeldBackend::prepare(const Collective& c) {
  if (selected(c)) log_.add("posted held collective");
  return posted_.record(c);
}

absl::Status HeldBackend::run(const Collective& c, absl::Time deadline) {
  if (selected(c)) {
    std::unique_lock lock(mu_);
    const auto wait = absl::ToChronoTime(deadline) - std::chrono::system_clock::now();
    if (!cv_.wait_for(lock, wait, [&] { return released_; })) {
      return absl::DeadlineExceededError(
          absl::StrCat(c.describe(), " was never released: the compute thread waited for it instead of going on"));
    }
    held_ = false;
    log_.add("completed held collective");
  }
  ZERO_RETURN_IF_ERROR(posted_.wait(stream_for(c), c));  // the copy below runs there
  // With one rank every collective's result is its input.
  if (c.send == nullptr || c.recv == nullptr || c.send == c.recv) return absl::OkStatus();
  return copy_bytes(c.recv, c.device, c.send, c.device, c.chunk_bytes());
}

bool HeldBackend::selected(const Collective& c) {
  std::lock_guard lock(mu_);
  if (armed_ && held_seq_ < 0 && hold_(c)) {
    held_seq_ = static_cast<int64_t>(c.seq);
    held_ = true;
  }
  return held_ && held_seq_ == static_cast<int64_t>(c.seq);
}

}  // namespace zero::testing
