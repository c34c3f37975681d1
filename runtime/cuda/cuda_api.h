// DeviceApi on CUDA: stream and event handles mapped to the runtime's own, memory from the devices' pools, errors as
// Status, failures sticky.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device_api.h"

namespace zero {

// Thread-safe. Each call sets the device of the handle it is given for its own duration, except launch, which
// CUDA runs on the current device and so refuses a stream of another. The first failure of a launch, or of a
// call that waits for device work (query, synchronize, copy), is returned by every later call.
class CudaApi final : public DeviceApi {
 public:
  CudaApi() = default;
  CudaApi(const CudaApi&) = delete;
  CudaApi& operator=(const CudaApi&) = delete;
  ~CudaApi() override;  // destroys the streams and events still registered

  DeviceType type() const override { return DeviceType::kCuda; }
  int device_count() const override;
  absl::Status set_current_device(int device) override;
  int current_device() const override;

  absl::StatusOr<Stream> create_stream(int device, StreamFlags flags) override;
  absl::Status destroy_stream(Stream stream) override;
  absl::StatusOr<Event> create_event(int device) override;
  absl::Status destroy_event(Event event) override;

  absl::Status record(Event event, Stream stream) override;
  absl::Status wait(Stream stream, Event event) override;
  absl::StatusOr<bool> query(Event event) override;
  absl::Status synchronize(Event event) override;
  absl::Status synchronize(Stream stream) override;
  absl::Status synchronize_device(int device) override;

  absl::StatusOr<void*> allocate(size_t bytes, Stream stream) override;
  absl::Status free(void* ptr, Stream stream) override;
  absl::StatusOr<void*> allocate_pinned(size_t bytes) override;
  absl::Status free_pinned(void* ptr) override;

  absl::Status copy_async(void* dst, const void* src, size_t bytes, Stream stream) override;
  absl::Status copy(void* dst, const void* src, size_t bytes) override;

  absl::Status launch(Stream stream, KernelLaunch launch) override;

  // Lets GPUs `a` and `b` (both in this process) read and write each other's pool memory (what allocate hands out),
  // where the hardware allows it. NCCL reads the buffers of the other GPUs of its process directly, which pool memory
  // allows only once its pool grants the access (cudaMemPoolSetAccess); the nccl backend calls this for each pair of
  // GPUs its ranks in one process use.
  absl::Status share_pool_memory(int a, int b);

 private:
  using Key = std::pair<int, uint64_t>;  // (device, id)

  // The native handle (cudaStreamLegacy for id 0); with `take`, also unregistered. InvalidArgument if unknown.
  absl::StatusOr<cudaStream_t> native(Stream stream, bool take = false);
  absl::StatusOr<cudaEvent_t> native(Event event, bool take = false);
  absl::Status failure() const;                // OK until device work failed
  absl::Status remember(absl::Status status);  // keeps the first failure; returns `status`
  absl::Status configure_pool(int device);     // once per device, before its first allocation

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;  // 0 names the legacy default stream
  absl::flat_hash_map<Key, cudaStream_t> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Key, cudaEvent_t> events_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  absl::Mutex pools_mu_;
  absl::flat_hash_set<int> configured_pools_ ABSL_GUARDED_BY(pools_mu_);
};

// The process-wide instance, never destroyed (the CUDA runtime may be unloaded before static destructors run).
CudaApi& cuda_api();

}  // namespace zero
