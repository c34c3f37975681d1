// Two mappings of one memfd, a first-fit free list over it, and a quarantine for freed blocks.
#include "runtime/sim/sim_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zero::sim {
namespace {

constexpr size_t kAlignment = 256;
constexpr unsigned char kPoison = 0xff;  // NaN as fp32, bf16 and fp16; -1 as int32

absl::Status os_error(const char* call) {
  return absl::InternalError(absl::StrCat("simulated device memory: ", call, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<SimMemory> SimMemory::create(size_t capacity, size_t quarantine_bytes) {
  const int fd = memfd_create("zero-sim-device", MFD_CLOEXEC);
  if (fd < 0) return os_error("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(capacity)) != 0) {
    close(fd);
    return os_error("ftruncate");
  }
  void* base = mmap(nullptr, capacity, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  void* alias = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (base == MAP_FAILED || alias == MAP_FAILED) {
    const absl::Status error = os_error("mmap");
    if (base != MAP_FAILED) munmap(base, capacity);
    if (alias != MAP_FAILED) munmap(alias, capacity);
    close(fd);
    return error;
  }
  return SimMemory(fd, reinterpret_cast<uintptr_t>(base), reinterpret_cast<uintptr_t>(alias), capacity,
                   quarantine_bytes);
}

SimMemory::SimMemory(SimMemory&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), base_(other.base_), alias_(other.alias_), capacity_(other.capacity_),
      quarantine_limit_(other.quarantine_limit_), free_(std::move(other.free_)), live_(std::move(other.live_)),
      quarantined_(std::move(other.quarantined_)), quarantined_bytes_(other.quarantined_bytes_) {}

SimMemory::~SimMemory() {
  if (fd_ < 0) return;
  munmap(reinterpret_cast<void*>(base_), capacity_);
  munmap(reinterpret_cast<void*>(alias_), capacity_);
  close(fd_);
}

absl::StatusOr<Block> SimMemory::allocate(size_t bytes, int device) {
  const size_t size = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  auto fit = [&] { return std::find_if(free_.begin(), free_.end(), [&](const auto& f) { return f.second >= size; }); };
  auto it = bytes > capacity_ ? free_.end() : fit();  // more than there is, where rounding up may wrap to 0
  while (it == free_.end() && bytes <= capacity_ && !quarantined_.empty()) {  // the quarantine yields first
    release_oldest();
    it = fit();
  }
  if (it == free_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat("simulated device sim:", device, " is out of memory allocating ",
                                                     bytes, " bytes (", live_.size(), " blocks live)"));
  }
  const auto [offset, available] = *it;
  free_.erase(it);
  if (available > size) free_[offset + size] = available - size;
  const Block block{.base = base_ + offset, .bytes = size, .device = device};
  std::memset(alias(reinterpret_cast<void*>(block.base)), kPoison, size);
  live_[block.base] = block;
  return block;
}

const Block* SimMemory::find(const void* ptr, size_t bytes) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = live_.upper_bound(p);
  if (it == live_.begin()) return nullptr;
  const Block& block = std::prev(it)->second;
  const size_t offset = p - block.base;  // p + bytes may wrap
  return offset <= block.bytes && bytes <= block.bytes - offset ? &block : nullptr;
}

void SimMemory::retire(uintptr_t base) { live_.erase(base); }

void SimMemory::quarantine(const Block& block) {
  std::memset(alias(reinterpret_cast<void*>(block.base)), kPoison, block.bytes);
  quarantined_.push_back(block);
  quarantined_bytes_ += block.bytes;
  // Each block waits until quarantine_bytes of later frees are behind it, however large it is itself.
  while (!quarantined_.empty() && quarantined_bytes_ - quarantined_.front().bytes >= quarantine_limit_) {
    release_oldest();
  }
}

void SimMemory::release_oldest() {
  quarantined_bytes_ -= quarantined_.front().bytes;
  give_back(quarantined_.front());
  quarantined_.pop_front();
}

void SimMemory::give_back(const Block& block) {
  size_t offset = block.base - base_;
  size_t size = block.bytes;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[offset] = size;
}

}  // namespace zero::sim
