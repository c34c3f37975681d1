// The accounting allocator: every byte a rank holds carries a category; peaks are kept and a budget enforced.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device.h"
#include "runtime/file_memory.h"
#include "runtime/tensor.h"

namespace zero {

enum class MemoryCategory : uint8_t {
  kParams,
  kGrads,
  kOptimizerState,
  kMasterWeights,
  kCommBuffers,
  kActivations,
  kWorkspace,
};
inline constexpr int kNumMemoryCategories = 7;
absl::string_view category_name(MemoryCategory c);

// "1.50 MiB" style, binary units.
std::string format_bytes(int64_t bytes);

struct MemoryStats {
  std::array<int64_t, kNumMemoryCategories> current{};
  std::array<int64_t, kNumMemoryCategories> peak{};
  int64_t current_total = 0;
  int64_t peak_total = 0;
  // Bytes held in files (see Allocator::place_in_files): outside the totals above and the budget.
  std::array<int64_t, kNumMemoryCategories> in_files{};
  // Freed host blocks kept for reuse (see Allocator): outside the totals above.
  int64_t cached = 0;
  // Of the totals, by where the bytes are: on a device other than the CPU (a GPU's memory), and in page-locked
  // host memory (Allocator::allocate_pinned); the rest is pageable host memory.
  int64_t device_current = 0;
  int64_t device_peak = 0;
  int64_t pinned_current = 0;
  int64_t pinned_peak = 0;

  int64_t current_of(MemoryCategory c) const { return current[static_cast<int>(c)]; }
  int64_t peak_of(MemoryCategory c) const { return peak[static_cast<int>(c)]; }
  int64_t in_files_of(MemoryCategory c) const { return in_files[static_cast<int>(c)]; }
  int64_t in_files_total() const;
};

class Allocator;
class DeviceApi;

// Owns one allocation; returns it (and its accounting) to the allocator on destruction or reset(), which may
// happen on any thread. Move-only; a Buffer itself is not for concurrent use from several threads.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void* data() const { return data_; }
  int64_t nbytes() const { return nbytes_; }
  MemoryCategory category() const { return category_; }
  Device device() const { return device_; }
  // A contiguous view of `shape` elements of `dtype` at the start of the buffer.
  Tensor tensor(DType dtype, Shape shape) const;
  // Frees now.
  void reset();

 private:
  friend class Allocator;
  Allocator* owner_ = nullptr;
  void* data_ = nullptr;
  int64_t nbytes_ = 0;
  MemoryCategory category_ = MemoryCategory::kWorkspace;
  Device device_ = Device::cpu();
  DeviceApi* pinned_by_ = nullptr;  // page-locked host memory of this API (Allocator::allocate_pinned)
};

// One per rank. Thread-safe: every method may be called from any thread (a rank's compute and
// communication threads both allocate). It must outlive every Buffer it handed out, and so whatever holds
// them (models, engines, a communicator given it as CommOptions::allocator): destroying it while bytes are
// still held aborts, naming them.
// The budget, when set, bounds the sum over all categories of what is held on devices of one type, the engine's:
// the CPU's RAM for an engine on the CPU, a GPU's memory for one on a GPU, whose host memory (ZeRO-Offload's
// master weights and optimizer state, host copies) is then counted but not bounded.
// CPU memory is 64-byte aligned. A freed host block of at least kMinCachedBytes is kept for the next
// allocation of the same size: every step frees and allocates the same gathered units, buckets and
// activations, which the C library would otherwise hand back to the kernel and fault in again page by
// page (a third of a GPT-2 small stage-3 step on 2 ranks). The oldest kept blocks are freed once they
// exceed the most this rank has held at once, or once what is held plus what is kept would exceed the
// budget; MemoryStats::cached says how much is kept. CUDA memory comes from the device's stream-ordered
// pool, which keeps freed memory for reuse itself: what is accounted is what is live, not what the pool holds.
class Allocator {
 public:
  explicit Allocator(int rank = 0, std::optional<int64_t> budget_bytes = std::nullopt,
                     DeviceType budgeted = DeviceType::kCpu);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Fails with ResourceExhausted (see is_out_of_memory) when the budget would be exceeded.
  absl::StatusOr<Buffer> allocate(int64_t nbytes, MemoryCategory category, Device device = Device::cpu());
  // Page-locked host memory from `api` (DeviceApi::allocate_pinned), for copies to and from its devices that run
  // beside the host: host memory to the budget (Device::cpu()), counted apart in MemoryStats::pinned_*. The
  // Buffer frees it with `api`, which must outlive it; free it only once the copies that use it finished.
  absl::StatusOr<Buffer> allocate_pinned(DeviceApi& api, int64_t nbytes, MemoryCategory category);

  // From now on, host allocations of `category` are backed by files in `dir` (an NVMe drive: ZeRO-Infinity's
  // offload; runtime/file_memory.h). They are counted in MemoryStats::in_files, not against the budget. A new one
  // is in RAM; page_out writes it to its file and drops it from RAM, and page_in reads it back: in between,
  // touching it is a crash (SIGSEGV). Fails, naming `dir`, if no file can be created there.
  absl::Status place_in_files(MemoryCategory category, const std::string& dir);
  // One host allocation backed by a new file in `dir`, counted as place_in_files counts a category's: for when
  // only some of a category's buffers go to files (the sharded parameters of ZeRO-Infinity's offload_param,
  // beside parameters kept whole in RAM).
  absl::StatusOr<Buffer> allocate_in_file(int64_t nbytes, MemoryCategory category, const std::string& dir);
  // The file-backed buffer whose data() is `buffer_data`: brought into RAM, written out and dropped, or dropped
  // unwritten (for one only read since page_in; written after all where its file is not current, as after a
  // failed write). Each blocks for its transfer and does nothing where there is nothing to do (the buffer already
  // there, or not file-backed). Thread-safe for distinct buffers.
  absl::Status page_in(const void* buffer_data);
  absl::Status page_out(const void* buffer_data);
  absl::Status drop_unchanged(const void* buffer_data);
  // Bytes of the file-backed buffers that are in RAM now (whole pages).
  int64_t file_bytes_in_ram() const;

  int rank() const { return rank_; }
  std::optional<int64_t> budget() const;
  DeviceType budgeted() const { return budgeted_; }  // the devices the budget bounds
  void set_budget(std::optional<int64_t> budget_bytes);
  MemoryStats stats() const;
  // Peaks restart from what is held now.
  void reset_peaks();
  // A table of current and peak bytes per category.
  std::string summary() const;

 private:
  friend class Buffer;
  struct CachedBlock {
    void* data;
    int64_t nbytes;
  };
  static constexpr int64_t kMinCachedBytes = int64_t{128} << 10;  // glibc's threshold for mmap
  // Whether a block of this size on this device is kept when freed, and so worth looking for in the cache.
  static bool cacheable(int64_t nbytes, Device device) { return device.is_cpu() && nbytes >= kMinCachedBytes; }

  void release(Buffer& buffer);
  // Adds nbytes of `category` on `device` (pinned: page-locked host memory) to the stats, or fails under the
  // budget without changing them.
  absl::Status count_locked(int64_t nbytes, MemoryCategory category, Device device, bool pinned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void uncount_locked(const Buffer& buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string held_description_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The newest kept block of exactly `nbytes`, taken out of the cache; nullptr if none.
  void* take_cached_locked(int64_t nbytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the oldest kept blocks until they fit within the most held, and held plus kept within the
  // budget; returns them, to be freed outside the lock.
  std::vector<CachedBlock> evict_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void free_blocks(const std::vector<CachedBlock>& blocks);

  const int rank_;
  const DeviceType budgeted_;  // the devices the budget bounds
  mutable absl::Mutex mu_;
  std::optional<int64_t> budget_ ABSL_GUARDED_BY(mu_);
  int64_t budgeted_current_ ABSL_GUARDED_BY(mu_) = 0;  // of stats_.current_total, what is on budgeted_ devices
  MemoryStats stats_ ABSL_GUARDED_BY(mu_);
  std::array<std::string, kNumMemoryCategories> file_dirs_ ABSL_GUARDED_BY(mu_);  // "" = RAM
  struct FileBuffer {
    FileMemory memory;
    size_t nbytes;
    bool in_ram = true;
    // The file held the memory's contents at the last transfer: not before the first write, nor after a failed one.
    bool file_current = false;
  };
  // Brings the file-backed buffer at `buffer_data` into RAM (`to_ram`), or out of it: written unless `unchanged`
  // and its file is current, dropped otherwise. The transfer runs outside the lock; a failed one changes nothing
  // but marks a failed write's file stale.
  absl::Status move_file_buffer(const void* buffer_data, bool to_ram, bool unchanged);
  absl::flat_hash_map<const void*, FileBuffer> file_buffers_ ABSL_GUARDED_BY(mu_);  // by data()
  std::vector<CachedBlock> cache_ ABSL_GUARDED_BY(mu_);                             // oldest first
  int64_t most_held_ ABSL_GUARDED_BY(mu_) = 0;  // the largest current_total so far; reset_peaks leaves it
};

// True for the status Allocator::allocate returns when a budget is exceeded.
bool is_out_of_memory(const absl::Status& status);

// `t` readable on the host: itself when it is on the CPU, else a copy in `holder` (kWorkspace of
// `allocator`), valid while `holder` lives.
absl::StatusOr<Tensor> on_host(const Tensor& t, Allocator& allocator, Buffer& holder);

}  // namespace zero
