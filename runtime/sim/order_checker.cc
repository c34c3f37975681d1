// Vector clocks and per-block access records: a missing wait is found from the order alone, whatever the timing.
#include "runtime/sim/order_checker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zero::sim {
namespace {

bool ordered_before(const OpStamp& earlier, const VectorClock& later) {
  return later.at(earlier.agent) >= earlier.tick;
}

std::string range(uintptr_t block, uintptr_t begin, uintptr_t end) {
  return absl::StrCat("bytes [", begin - block, ", ", end - block, ") of block 0x", absl::Hex(block));
}

}  // namespace

uint64_t VectorClock::tick(Agent agent) {
  if (agent >= ticks_.size()) ticks_.resize(agent + 1, 0);
  return ++ticks_[agent];
}

void VectorClock::join(const VectorClock& other) {
  if (other.ticks_.size() > ticks_.size()) ticks_.resize(other.ticks_.size(), 0);
  for (size_t a = 0; a < other.ticks_.size(); ++a) ticks_[a] = std::max(ticks_[a], other.ticks_[a]);
}

absl::Status AccessHistory::access(uintptr_t block, uintptr_t begin, uintptr_t end, bool write,
                                   std::shared_ptr<const OpStamp> op, const VectorClock& clock) {
  std::vector<Record>& records = blocks_[block];
  for (auto it = records.rbegin(); it != records.rend(); ++it) {  // the latest conflict is the one to name
    const Record& r = *it;
    const bool overlaps = r.begin < end && begin < r.end;
    if (!overlaps || !(r.write || write) || ordered_before(*r.op, clock)) continue;
    return absl::FailedPreconditionError(
        absl::StrCat(op->name, (write ? " writes " : " reads "), range(block, begin, end), ", not ordered after ",
                     r.op->name, ", which ", (r.write ? "writes " : "reads "), range(block, r.begin, r.end),
                     ": make the first's stream record an event and the second's wait for it"));
  }
  // A record inside this access and ordered before it says nothing more, unless it is a write and this a read:
  // a later read must still be ordered after that write.
  std::erase_if(records, [&](const Record& r) {
    return begin <= r.begin && r.end <= end && (write || !r.write) && ordered_before(*r.op, clock);
  });
  records.push_back({begin, end, write, std::move(op)});
  return absl::OkStatus();
}

absl::Status AccessHistory::release(uintptr_t block, const OpStamp& op, const VectorClock& clock) {
  const auto it = blocks_.find(block);
  if (it == blocks_.end()) return absl::OkStatus();
  absl::Status status;
  for (const Record& r : it->second) {
    if (ordered_before(*r.op, clock)) continue;
    status = absl::FailedPreconditionError(absl::StrCat(op.name, " frees block 0x", absl::Hex(block),
                                                        ", not ordered after ", r.op->name, ", which ",
                                                        (r.write ? "writes " : "reads "), range(block, r.begin, r.end),
                                                        ": free it on that stream, or after an event recorded there"));
    break;
  }
  blocks_.erase(it);
  return status;
}

}  // namespace zero::sim
