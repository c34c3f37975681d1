// The simulated devices' memory: addresses the host cannot dereference, reached by kernels through a second mapping,
// with freed blocks poisoned and quarantined before reuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>

#include "absl/status/statusor.h"

namespace zero::sim {

// One allocation, as handed out: `base` is a device address (PROT_NONE to the host).
struct Block {
  uintptr_t base = 0;
  size_t bytes = 0;
  int device = 0;
};

// One memfd mapped twice: PROT_NONE at the addresses handed out, read-write at an alias that only launch bodies
// and copies reach (so a host read of device memory crashes, as on a GPU). Not thread-safe: the device locks.
class SimMemory {
 public:
  static absl::StatusOr<SimMemory> create(size_t capacity, size_t quarantine_bytes);
  SimMemory(SimMemory&& other) noexcept;
  SimMemory& operator=(SimMemory&&) = delete;
  SimMemory(const SimMemory&) = delete;
  ~SimMemory();

  // A new block of `bytes` (rounded up to 256, CUDA's alignment) filled with NaN (0xff bytes: NaN in fp32, bf16
  // and fp16), as uninitialized device memory should be distrusted. ResourceExhausted when it does not fit.
  absl::StatusOr<Block> allocate(size_t bytes, int device);
  // The live block holding [ptr, ptr + bytes), or null.
  const Block* find(const void* ptr, size_t bytes) const;
  bool contains(const void* ptr) const { return reinterpret_cast<uintptr_t>(ptr) - base_ < capacity_; }
  // Marks a live block freed: no longer found; its bytes come back through quarantine().
  void retire(uintptr_t base);
  // The freed block's bytes, poisoned with NaN, wait behind later frees (quarantine_bytes of them) before
  // reuse, so a late reader sees NaN rather than another tensor's values.
  void quarantine(const Block& block);
  // Where the host may touch device address `ptr`: ptr + alias_shift().
  void* alias(const void* ptr) const {
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(ptr) + alias_shift());
  }
  uintptr_t alias_shift() const { return alias_ - base_; }  // modulo 2^64

 private:
  SimMemory(int fd, uintptr_t base, uintptr_t alias, size_t capacity, size_t quarantine_bytes)
      : fd_(fd), base_(base), alias_(alias), capacity_(capacity), quarantine_limit_(quarantine_bytes) {
    free_[0] = capacity;
  }
  void release_oldest();
  void give_back(const Block& block);

  int fd_ = -1;
  uintptr_t base_ = 0;
  uintptr_t alias_ = 0;
  size_t capacity_ = 0;
  size_t quarantine_limit_ = 0;
  std::map<size_t, size_t> free_;    // offset -> bytes, coalesced
  std::map<uintptr_t, Block> live_;  // base -> block
  std::deque<Block> quarantined_;
  size_t quarantined_bytes_ = 0;
};

}  // namespace zero::sim
