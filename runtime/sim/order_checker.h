// Happens-before checking for the simulated device: vector clocks over streams and host threads, and the accesses
// to each block of device memory that a later access must be ordered after.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace zero::sim {

// Whatever runs operations one after another: a stream or a host thread.
using Agent = uint32_t;

// clock.at(a) = how many of agent a's operations are ordered before (or are) the one holding the clock.
class VectorClock {
 public:
  uint64_t at(Agent agent) const { return agent < ticks_.size() ? ticks_[agent] : 0; }
  // The holder is agent's next operation.
  uint64_t tick(Agent agent);
  // Everything ordered before `other` is ordered before the holder too.
  void join(const VectorClock& other);

 private:
  std::vector<uint64_t> ticks_;
};

// One operation as messages name it: "launch 'gelu_forward' on sim:0 stream 2".
struct OpStamp {
  Agent agent = 0;
  uint64_t tick = 0;
  std::string name;
};

// The accesses to each block of device memory (keyed by its base address) since it was allocated.
class AccessHistory {
 public:
  // Checks an access to [begin, end) of `block` by the operation `op` whose clock is `clock` against each
  // earlier access to an overlapping range where either writes, then records it. FailedPrecondition naming
  // both operations when they are not ordered.
  absl::Status access(uintptr_t block, uintptr_t begin, uintptr_t end, bool write, std::shared_ptr<const OpStamp> op,
                      const VectorClock& clock);
  // A free of `block` by `op`: every access recorded must be ordered before it. Forgets the block either way.
  absl::Status release(uintptr_t block, const OpStamp& op, const VectorClock& clock);

 private:
  struct Record {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    bool write = false;
    std::shared_ptr<const OpStamp> op;
  };
  absl::flat_hash_map<uintptr_t, std::vector<Record>> blocks_;
};

}  // namespace zero::sim
