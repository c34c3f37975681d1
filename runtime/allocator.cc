#include "runtime/allocator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "runtime/device_api.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

namespace zero {

namespace {
constexpr absl::string_view kOutOfMemoryTag = "zero: out of memory";
}

absl::string_view category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kParams: return "params";
    case MemoryCategory::kGrads: return "grads";
    case MemoryCategory::kOptimizerState: return "optimizer_state";
    case MemoryCategory::kMasterWeights: return "master_weights";
    case MemoryCategory::kCommBuffers: return "comm_buffers";
    case MemoryCategory::kActivations: return "activations";
    case MemoryCategory::kWorkspace: return "workspace";
  }
  return "?";
}

std::string format_bytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while ((v >= 1024.0 || v <= -1024.0) && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%d B", bytes) : absl::StrFormat("%.2f %s", v, kUnits[unit]);
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    nbytes_ = std::exchange(other.nbytes_, 0);
    category_ = other.category_;
    device_ = other.device_;
    pinned_by_ = std::exchange(other.pinned_by_, nullptr);
  }
  return *this;
}

Tensor Buffer::tensor(DType dtype, Shape shape) const {
  ZERO_CHECK(shape_numel(shape) * static_cast<int64_t>(dtype_size(dtype)) <= nbytes_, "tensor ", shape_string(shape),
             " of ", dtype_name(dtype), " does not fit a buffer of ", nbytes_, " bytes");
  return Tensor(data_, dtype, std::move(shape), device_);
}

void Buffer::reset() {
  if (owner_ != nullptr) owner_->release(*this);
  owner_ = nullptr;
  data_ = nullptr;
  nbytes_ = 0;
  pinned_by_ = nullptr;
}

int64_t MemoryStats::in_files_total() const {
  int64_t total = 0;
  for (int64_t bytes : in_files) total += bytes;
  return total;
}

Allocator::Allocator(int rank, std::optional<int64_t> budget_bytes, DeviceType budgeted)
    : rank_(rank), budgeted_(budgeted), budget_(budget_bytes) {}

Allocator::~Allocator() {
  free_blocks(cache_);
  ZERO_CHECK(stats_.current_total == 0 && file_buffers_.empty(), "rank ", rank_, " allocator destroyed while ",
             format_bytes(stats_.current_total), " are still held: ", held_description_locked());
}

absl::StatusOr<Buffer> Allocator::allocate(int64_t nbytes, MemoryCategory category, Device device) {
  if (nbytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative allocation of ", nbytes, " bytes"));
  const int c = static_cast<int>(category);
  void* reused = nullptr;
  std::vector<CachedBlock> evicted;
  std::string file_dir;
  {
    absl::MutexLock lock(&mu_);
    if (device.is_cpu()) file_dir = file_dirs_[c];
  }
  if (!file_dir.empty() && nbytes > 0) return allocate_in_file(nbytes, category, file_dir);
  {
    absl::MutexLock lock(&mu_);
    // Accounted before the allocation so concurrent requests cannot both slip under the budget.
    ZERO_RETURN_IF_ERROR(count_locked(nbytes, category, device, /*pinned=*/false));
    if (cacheable(nbytes, device)) reused = take_cached_locked(nbytes);
    evicted = evict_locked();
  }
  free_blocks(evicted);
  Buffer buffer;
  buffer.owner_ = this;
  buffer.nbytes_ = nbytes;
  buffer.category_ = category;
  buffer.device_ = device;
  if (reused != nullptr) {
    buffer.data_ = reused;
    return buffer;
  }
  absl::StatusOr<void*> ptr = nbytes == 0 ? nullptr : device_alloc(device, static_cast<size_t>(nbytes));
  if (!ptr.ok()) return ptr.status();  // `buffer` gives the accounting back
  buffer.data_ = *ptr;
  return buffer;
}

absl::StatusOr<Buffer> Allocator::allocate_pinned(DeviceApi& api, int64_t nbytes, MemoryCategory category) {
  if (nbytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative allocation of ", nbytes, " bytes"));
  {
    absl::MutexLock lock(&mu_);
    ZERO_RETURN_IF_ERROR(count_locked(nbytes, category, Device::cpu(), /*pinned=*/true));
  }
  Buffer buffer;
  buffer.owner_ = this;
  buffer.nbytes_ = nbytes;
  buffer.category_ = category;
  buffer.pinned_by_ = &api;
  absl::StatusOr<void*> ptr = nbytes == 0 ? nullptr : api.allocate_pinned(static_cast<size_t>(nbytes));
  if (!ptr.ok()) return ptr.status();  // `buffer` gives the accounting back
  buffer.data_ = *ptr;
  return buffer;
}

absl::Status Allocator::count_locked(int64_t nbytes, MemoryCategory category, Device device, bool pinned) {
  const int c = static_cast<int>(category);
  const bool budgeted = device.type == budgeted_;
  if (budget_ && budgeted && budgeted_current_ + nbytes > *budget_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s on rank %d: %s asked for %s (%d bytes), but the budget is %s and %s of it is held (the rank holds %s). "
        "Raise the budget, or hold less per rank: a higher ZeRO stage, offload, smaller buckets or batches.",
        kOutOfMemoryTag, rank_, category_name(category), format_bytes(nbytes), nbytes, format_bytes(*budget_),
        format_bytes(budgeted_current_), held_description_locked()));
  }
  if (budgeted) budgeted_current_ += nbytes;
  stats_.current[c] += nbytes;
  stats_.current_total += nbytes;
  stats_.peak[c] = std::max(stats_.peak[c], stats_.current[c]);
  stats_.peak_total = std::max(stats_.peak_total, stats_.current_total);
  if (!device.is_cpu()) {
    stats_.device_current += nbytes;
    stats_.device_peak = std::max(stats_.device_peak, stats_.device_current);
  }
  if (pinned) {
    stats_.pinned_current += nbytes;
    stats_.pinned_peak = std::max(stats_.pinned_peak, stats_.pinned_current);
  }
  most_held_ = std::max(most_held_, stats_.current_total);
  return absl::OkStatus();
}

void Allocator::uncount_locked(const Buffer& buffer) {
  stats_.current[static_cast<int>(buffer.category_)] -= buffer.nbytes_;
  stats_.current_total -= buffer.nbytes_;
  if (buffer.device_.type == budgeted_) budgeted_current_ -= buffer.nbytes_;
  if (!buffer.device_.is_cpu()) stats_.device_current -= buffer.nbytes_;
  if (buffer.pinned_by_ != nullptr) stats_.pinned_current -= buffer.nbytes_;
}

void* Allocator::take_cached_locked(int64_t nbytes) {
  for (auto it = cache_.rbegin(); it != cache_.rend(); ++it) {
    if (it->nbytes != nbytes) continue;
    void* data = it->data;
    cache_.erase(std::next(it).base());
    stats_.cached -= nbytes;
    return data;
  }
  return nullptr;
}

std::vector<Allocator::CachedBlock> Allocator::evict_locked() {
  // Kept blocks are host memory: under a budget of the CPU's they count against it.
  const bool bounded = budget_ && budgeted_ == DeviceType::kCpu;
  const int64_t limit = bounded ? std::min(most_held_, *budget_ - budgeted_current_) : most_held_;
  size_t dropped = 0;
  while (dropped < cache_.size() && stats_.cached > limit) stats_.cached -= cache_[dropped++].nbytes;
  std::vector<CachedBlock> evicted(cache_.begin(), cache_.begin() + static_cast<ptrdiff_t>(dropped));
  cache_.erase(cache_.begin(), cache_.begin() + static_cast<ptrdiff_t>(dropped));
  return evicted;
}

void Allocator::free_blocks(const std::vector<CachedBlock>& blocks) {
  for (const CachedBlock& block : blocks) device_free(Device::cpu(), block.data);
}

absl::StatusOr<Buffer> Allocator::allocate_in_file(int64_t nbytes, MemoryCategory category, const std::string& dir) {
  ZERO_ASSIGN_OR_RETURN(const FileMemory memory, file_alloc(dir, static_cast<size_t>(nbytes)));
  absl::MutexLock lock(&mu_);
  stats_.in_files[static_cast<int>(category)] += nbytes;
  file_buffers_[memory.data] = {memory, static_cast<size_t>(nbytes)};
  Buffer buffer;
  buffer.owner_ = this;
  buffer.data_ = memory.data;
  buffer.nbytes_ = nbytes;
  buffer.category_ = category;
  return buffer;
}

void Allocator::release(Buffer& buffer) {
  std::optional<FileBuffer> file;
  bool kept = false;
  std::vector<CachedBlock> evicted;
  {
    absl::MutexLock lock(&mu_);
    const auto it = file_buffers_.find(buffer.data_);
    if (it != file_buffers_.end()) {
      file = it->second;
      file_buffers_.erase(it);
      stats_.in_files[static_cast<int>(buffer.category_)] -= buffer.nbytes_;
    } else {
      uncount_locked(buffer);
      kept = buffer.pinned_by_ == nullptr && cacheable(buffer.nbytes_, buffer.device_);
      if (kept) {
        cache_.push_back({buffer.data_, buffer.nbytes_});
        stats_.cached += buffer.nbytes_;
        evicted = evict_locked();
      }
    }
  }
  free_blocks(evicted);
  if (file) {
    file_free(file->memory, file->nbytes);
  } else if (buffer.pinned_by_ != nullptr) {
    if (buffer.data_ != nullptr) (void)buffer.pinned_by_->free_pinned(buffer.data_);  // as PinnedBuffer's
  } else if (!kept && buffer.data_ != nullptr) {
    device_free(buffer.device_, buffer.data_);
  }
}

absl::Status Allocator::place_in_files(MemoryCategory category, const std::string& dir) {
  ZERO_RETURN_IF_ERROR(check_file_dir(dir));
  absl::MutexLock lock(&mu_);
  file_dirs_[static_cast<int>(category)] = dir;
  return absl::OkStatus();
}

absl::Status Allocator::move_file_buffer(const void* buffer_data, bool to_ram, bool unchanged) {
  FileBuffer file;
  {
    absl::MutexLock lock(&mu_);
    const auto it = file_buffers_.find(buffer_data);
    if (it == file_buffers_.end() || it->second.in_ram == to_ram) return absl::OkStatus();
    file = it->second;
  }
  const bool writes = !to_ram && !(unchanged && file.file_current);
  const absl::Status status = to_ram   ? file_read_in(file.memory, file.nbytes)
                              : writes ? file_write_out(file.memory, file.nbytes)
                                       : file_drop(file.memory, file.nbytes);
  absl::MutexLock lock(&mu_);
  const auto it = file_buffers_.find(buffer_data);
  if (it == file_buffers_.end()) return status;
  if (status.ok()) it->second.in_ram = to_ram;
  it->second.file_current = status.ok() || !writes;  // a failed write leaves the file stale
  return status;
}

absl::Status Allocator::page_in(const void* buffer_data) { return move_file_buffer(buffer_data, true, false); }

absl::Status Allocator::page_out(const void* buffer_data) { return move_file_buffer(buffer_data, false, false); }

absl::Status Allocator::drop_unchanged(const void* buffer_data) { return move_file_buffer(buffer_data, false, true); }

int64_t Allocator::file_bytes_in_ram() const {
  absl::MutexLock lock(&mu_);
  int64_t in_ram = 0;
  for (const auto& [data, file] : file_buffers_) {
    in_ram += static_cast<int64_t>(file_resident_bytes(file.memory, file.nbytes));
  }
  return in_ram;
}

std::optional<int64_t> Allocator::budget() const {
  absl::MutexLock lock(&mu_);
  return budget_;
}

void Allocator::set_budget(std::optional<int64_t> budget_bytes) {
  std::vector<CachedBlock> evicted;
  {
    absl::MutexLock lock(&mu_);
    budget_ = budget_bytes;
    evicted = evict_locked();
  }
  free_blocks(evicted);
}

MemoryStats Allocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Allocator::reset_peaks() {
  absl::MutexLock lock(&mu_);
  stats_.peak = stats_.current;
  stats_.peak_total = stats_.current_total;
  stats_.device_peak = stats_.device_current;
  stats_.pinned_peak = stats_.pinned_current;
}

std::string Allocator::held_description_locked() const {
  std::string out;
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    if (stats_.current[c] == 0) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", category_name(static_cast<MemoryCategory>(c)), " ",
                    format_bytes(stats_.current[c]));
  }
  return out.empty() ? "nothing" : out;
}

std::string Allocator::summary() const {
  absl::MutexLock lock(&mu_);
  std::string out = absl::StrFormat("rank %d memory%s\n%-16s %14s %14s\n", rank_,
                                    budget_ ? absl::StrCat(" (budget ", format_bytes(*budget_), ")") : "", "category",
                                    "current", "peak");
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    absl::StrAppendFormat(&out, "%-16s %14s %14s\n", category_name(static_cast<MemoryCategory>(c)),
                          format_bytes(stats_.current[c]), format_bytes(stats_.peak[c]));
  }
  absl::StrAppendFormat(&out, "%-16s %14s %14s\n", "total", format_bytes(stats_.current_total),
                        format_bytes(stats_.peak_total));
  if (stats_.device_peak > 0) {
    absl::StrAppendFormat(&out, "%-16s %14s %14s of the total\n", "on devices", format_bytes(stats_.device_current),
                          format_bytes(stats_.device_peak));
  }
  if (stats_.pinned_peak > 0) {
    absl::StrAppendFormat(&out, "%-16s %14s %14s of the total, page-locked host memory\n", "pinned",
                          format_bytes(stats_.pinned_current), format_bytes(stats_.pinned_peak));
  }
  if (stats_.cached > 0) {
    absl::StrAppendFormat(&out, "%-16s %14s freed, kept for reuse\n", "cached", format_bytes(stats_.cached));
  }
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    if (stats_.in_files[c] == 0) continue;
    absl::StrAppendFormat(&out, "%-16s %14s in files (%s)\n", category_name(static_cast<MemoryCategory>(c)),
                          format_bytes(stats_.in_files[c]), file_dirs_[c]);
  }
  return out;
}

absl::StatusOr<Tensor> on_host(const Tensor& t, Allocator& allocator, Buffer& holder) {
  if (t.device().is_cpu()) return t;
  ZERO_ASSIGN_OR_RETURN(holder, allocator.allocate(static_cast<int64_t>(t.nbytes()), MemoryCategory::kWorkspace));
  ZERO_RETURN_IF_ERROR(copy_bytes(holder.data(), Device::cpu(), t.data(), t.device(), t.nbytes()));
  return holder.tensor(t.dtype(), t.shape());
}

bool is_out_of_memory(const absl::Status& status) {
  return absl::IsResourceExhausted(status) && absl::StartsWith(status.message(), kOutOfMemoryTag);
}

}  // namespace zero
