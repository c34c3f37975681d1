#include "runtime/comm/post_events.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

namespace zero {

absl::StatusOr<OwnedEvent> PostEvents::spare_event(Device device) {
  {
    absl::MutexLock lock(&mu_);
    const auto it = std::find_if(spare_.begin(), spare_.end(), [&](const Posted& p) { return p.device == device; });
    if (it != spare_.end()) {
      OwnedEvent event = std::move(it->event);
      spare_.erase(it);
      return event;
    }
  }
  return OwnedEvent::create(*device_api(device), device.index);
}

absl::Status PostEvents::record(const Collective& c) {
  if (c.device.is_cpu()) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(OwnedEvent event, spare_event(c.device));
  ZERO_RETURN_IF_ERROR(device_api(c.device)->record(event.get(), current_stream(c.device)));
  absl::MutexLock lock(&mu_);
  posted_.push_back({c.device, std::move(event)});
  return absl::OkStatus();
}

absl::Status PostEvents::wait(Stream stream, const Collective& c) {
  if (c.device.is_cpu()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (posted_.empty() || posted_.front().device != c.device) {
    return absl::InternalError(absl::StrCat(c.describe(), " was not prepared when posted"));
  }
  Posted posted = std::move(posted_.front());
  posted_.pop_front();
  const absl::Status status = device_api(c.device)->wait(stream, posted.event.get());  // the record as it is now
  spare_.push_back(std::move(posted));
  return status;
}

}  // namespace zero
