// PinnedUploads: a pool of page-locked blocks, each free again once the event after its copy completed.
#include "runtime/pinned_uploads.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

namespace zero {

namespace {
constexpr size_t kMinBlockBytes = size_t{64} << 10;  // small uploads share a size, so blocks are reused
}  // namespace

absl::StatusOr<PinnedUploads::Block*> PinnedUploads::free_block(int device, size_t bytes) {
  Block* found = nullptr;
  for (const std::unique_ptr<Block>& block : blocks_) {
    if (block->device != device) continue;
    ZERO_ASSIGN_OR_RETURN(const bool done, api_.query(block->copied.get()));  // never recorded: done
    if (!done) continue;
    found = block.get();
    if (block->memory.bytes() >= bytes) return found;
  }
  const size_t size = std::max(bytes, kMinBlockBytes);
  if (found == nullptr) {
    ZERO_ASSIGN_OR_RETURN(OwnedEvent copied, OwnedEvent::create(api_, device));
    blocks_.push_back(std::make_unique<Block>(Block{.device = device, .memory = {}, .copied = std::move(copied)}));
    found = blocks_.back().get();
  }
  found->memory = PinnedBuffer();  // a free block too small for `bytes`: replaced
  ZERO_ASSIGN_OR_RETURN(found->memory, PinnedBuffer::allocate(api_, size));
  return found;
}

absl::Status PinnedUploads::upload(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  ZERO_ASSIGN_OR_RETURN(Block * block, free_block(stream.device, bytes));
  std::memcpy(block->memory.data(), src, bytes);
  ZERO_RETURN_IF_ERROR(api_.copy_async(dst, block->memory.data(), bytes, stream));
  return api_.record(block->copied.get(), stream);
}

size_t PinnedUploads::blocks() const {
  absl::MutexLock lock(&mu_);
  return blocks_.size();
}

PinnedUploads* pinned_uploads(Device device) {
  DeviceApi* api = device_api(device);
  if (api == nullptr) return nullptr;
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  static auto* uploads ABSL_GUARDED_BY(mu) = new absl::flat_hash_map<DeviceApi*, std::unique_ptr<PinnedUploads>>;
  absl::MutexLock lock(&mu);
  std::unique_ptr<PinnedUploads>& found = (*uploads)[api];
  if (found == nullptr) found = std::make_unique<PinnedUploads>(*api);
  return found.get();
}

}  // namespace zero
