// A one-rank Backend that holds a chosen collective open until the test releases it: overlap shown, not assumed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/comm/backend.h"
#include "runtime/comm/post_events.h"

namespace zero::testing {

// What the compute thread and the communication thread did, in the order they did it.
class EventLog {
 public:
  void add(std::string event);
  std::vector<std::string> events() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> events_;
};

// One rank (a collective is a copy, on its buffers' device), which holds the first collective `hold` selects once
// armed until release() — or until the collective's deadline, failing it. Logs "posted held collective" when the
// compute thread posts it and "completed held collective" when it completes.
class HeldBackend final : public Backend {
 public:
  HeldBackend(std::function<bool(const Collective&)> hold, EventLog& log) : hold_(std::move(hold)), log_(log) {}

  absl::string_view name() const override { return "held"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  bool supports(Device device) const override { return device.is_cpu() || device.is_sim(); }

  void arm();
  bool awaits_release();  // armed and not yet released
  void release();

  absl::Status prepare(const Collective& c) override;
  absl::Status run(const Collective& c, absl::Time deadline) override;

 private:
  // The first armed collective `hold_` picks (prepare and run see the same one).
  bool selected(const Collective& c);

  const std::function<bool(const Collective&)> hold_;
  EventLog& log_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool released_ = false;
  bool held_ = false;
  int64_t held_seq_ = -1;
  PostEvents posted_;
};

}  // namespace zero::testing
