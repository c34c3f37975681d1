#include "runtime/cuda/cuda_api.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/status.h"

namespace zero {

namespace {

// "13.0" for CUDA's version number 13000.
std::string cuda_version_name(int version) { return absl::StrCat(version / 1000, ".", version % 1000 / 10); }

// What `query` answers (a device count, the driver's version), or 0 where it fails (no driver), its error cleared.
int cuda_number_or_zero(cudaError_t (*query)(int*)) {
  int number = 0;
  if (query(&number) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return number;
}

// The driver's CUDA version, 0 when no driver is loaded.
int driver_version() { return cuda_number_or_zero(cudaDriverGetVersion); }

// The native handle registered under (device, id); with `take`, also removed. InvalidArgument naming it if none.
template <typename Native>
absl::StatusOr<Native> look_up(absl::flat_hash_map<std::pair<int, uint64_t>, Native>& registry,
                               std::pair<int, uint64_t> key, bool take, absl::string_view kind) {
  const auto it = registry.find(key);
  if (it == registry.end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown ", kind, " ", key.second, " of cuda:", key.first,
                                                   ": not created by this CudaApi, or destroyed"));
  }
  const Native native = it->second;
  if (take) registry.erase(it);
  return native;
}

absl::StatusOr<int> cuda_current_device() {
  int device = 0;
  ZERO_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  return device;
}

absl::StatusOr<cudaPointerAttributes> attributes(const void* ptr) {
  cudaPointerAttributes attributes{};
  ZERO_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attributes, ptr));
  return attributes;
}

absl::StatusOr<cudaMemPool_t> default_pool(int device) {
  cudaMemPool_t pool = nullptr;
  ZERO_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device));
  return pool;
}

// Lets `peer` read and write the memory of `owner`'s pool, if it can reach `owner` at all.
absl::Status grant_pool_access(int owner, int peer) {
  int can_access = 0;
  ZERO_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can_access, peer, owner));
  if (can_access == 0) return absl::OkStatus();  // NCCL then goes through its own buffers
  ZERO_ASSIGN_OR_RETURN(cudaMemPool_t pool, default_pool(owner));
  cudaMemAccessDesc access{};
  access.location.type = cudaMemLocationTypeDevice;
  access.location.id = peer;
  access.flags = cudaMemAccessFlagsProtReadWrite;
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAccess(pool, &access, 1));
  return absl::OkStatus();
}

// CUDA stages pageable host memory and may copy it before cudaMemcpyAsync returns, outside the stream's order.
absl::Status refuse_pageable(const void* ptr, absl::string_view side) {
  ZERO_ASSIGN_OR_RETURN(const cudaPointerAttributes found, attributes(ptr));
  if (found.type != cudaMemoryTypeUnregistered) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("copy_async: the ", side, " is pageable host memory; allocate it with allocate_pinned"));
}

// Device memory is the pointer itself on CUDA; a pointer outside the launch's declared accesses is refused,
// as the simulated device refuses it.
class CudaLaunchContext final : public LaunchContext {
 public:
  CudaLaunchContext(cudaStream_t stream, const KernelLaunch& launch) : stream_(stream), launch_(launch) {}

  void* native_stream() const override { return stream_; }

  absl::StatusOr<void*> host_pointer(const void* device_ptr, size_t bytes) const override {
    const auto begin = reinterpret_cast<uintptr_t>(device_ptr);
    for (const Access& access : launch_.accesses) {
      const auto start = reinterpret_cast<uintptr_t>(access.ptr);
      if (begin >= start && begin + bytes <= start + access.bytes) return const_cast<void*>(device_ptr);
    }
    return absl::InvalidArgumentError(absl::StrFormat("launch %s: %d bytes at %p lie in none of its declared accesses",
                                                      launch_.name, bytes, device_ptr));
  }

 private:
  cudaStream_t stream_;
  const KernelLaunch& launch_;
};

}  // namespace

int cuda_device_count() { return cuda_number_or_zero(cudaGetDeviceCount); }

std::string why_no_cuda_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  cudaGetLastError();
  if (err == cudaSuccess && count > 0) return absl::StrCat(count, " CUDA device(s) visible");
  const std::string call = err == cudaSuccess ? "cudaGetDeviceCount: 0 devices"
                                              : absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(err), " (",
                                                             cudaGetErrorString(err), ")");
  const std::string built = cuda_version_name(CUDART_VERSION);
  // Without a driver CUDA also says cudaErrorInsufficientDriver: the driver's version (0) tells that from an old one.
  const int driver = driver_version();
  if (driver == 0) {
    return absl::StrCat("no CUDA GPU or driver found (", call,
                        "); run on a machine with an NVIDIA GPU and a driver for CUDA ", built, " or newer");
  }
  if (driver < CUDART_VERSION) {
    return absl::StrCat("the NVIDIA driver is for CUDA ", cuda_version_name(driver), " and zero was built with CUDA ",
                        built, " (", call, "); install a driver for CUDA ", built, " or newer");
  }
  return absl::StrCat("no CUDA GPU found by the driver for CUDA ", cuda_version_name(driver), " (", call,
                      "); check CUDA_VISIBLE_DEVICES, and nvidia-smi for the GPU");
}

CudaApi::~CudaApi() {
  absl::MutexLock lock(&mu_);
  CudaDeviceGuard guard;
  for (const auto& [key, stream] : streams_) {
    if (guard.set(key.first).ok()) cudaStreamDestroy(stream);
  }
  for (const auto& [key, event] : events_) {
    if (guard.set(key.first).ok()) cudaEventDestroy(event);
  }
}

int CudaApi::device_count() const { return cuda_device_count(); }

absl::Status CudaApi::set_current_device(int device) {
  ZERO_RETURN_IF_ERROR(failure());
  return cuda_status(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")").c_str());
}

// 0, CUDA's default, where CUDA cannot tell (no device).
int CudaApi::current_device() const { return cuda_current_device().value_or(0); }

absl::StatusOr<Stream> CudaApi::create_stream(int device, StreamFlags flags) {
  ZERO_RETURN_IF_ERROR(failure());
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  cudaStream_t stream = nullptr;
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(
      &stream, flags == StreamFlags::kNonBlocking ? cudaStreamNonBlocking : cudaStreamDefault));
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  streams_[{device, id}] = stream;
  return Stream{device, id};
}

absl::Status CudaApi::destroy_stream(Stream stream) {
  ZERO_RETURN_IF_ERROR(failure());
  if (stream.id == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the legacy default stream of cuda:", stream.device, " cannot be destroyed"));
  }
  ZERO_ASSIGN_OR_RETURN(cudaStream_t native_stream, native(stream, /*take=*/true));
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(stream.device));
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(native_stream));
  return absl::OkStatus();
}

absl::StatusOr<Event> CudaApi::create_event(int device) {
  ZERO_RETURN_IF_ERROR(failure());
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  cudaEvent_t event = nullptr;
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  events_[{device, id}] = event;
  return Event{device, id};
}

absl::Status CudaApi::destroy_event(Event event) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_ASSIGN_OR_RETURN(cudaEvent_t native_event, native(event, /*take=*/true));
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(event.device));
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventDestroy(native_event));
  return absl::OkStatus();
}

absl::Status CudaApi::record(Event event, Stream stream) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_ASSIGN_OR_RETURN(cudaEvent_t native_event, native(event));
  ZERO_ASSIGN_OR_RETURN(cudaStream_t native_stream, native(stream));
  if (event.device != stream.device) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot record an event of cuda:", event.device, " on a stream of cuda:", stream.device));
  }
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(stream.device));
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventRecord(native_event, native_stream));
  return absl::OkStatus();
}

absl::Status CudaApi::wait(Stream stream, Event event) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_ASSIGN_OR_RETURN(cudaStream_t native_stream, native(stream));
  ZERO_ASSIGN_OR_RETURN(cudaEvent_t native_event, native(event));
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(stream.device));
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(native_stream, native_event, 0));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaApi::query(Event event) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_ASSIGN_OR_RETURN(cudaEvent_t native_event, native(event));
  const cudaError_t err = cudaEventQuery(native_event);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  ZERO_RETURN_IF_ERROR(remember(cuda_status(err, "cudaEventQuery")));
  return true;
}

absl::Status CudaApi::synchronize(Event event) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_ASSIGN_OR_RETURN(cudaEvent_t native_event, native(event));
  return remember(cuda_status(cudaEventSynchronize(native_event), "cudaEventSynchronize"));
}

absl::Status CudaApi::synchronize(Stream stream) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_ASSIGN_OR_RETURN(cudaStream_t native_stream, native(stream));
  CudaDeviceGuard guard;  // the legacy stream is the current device's
  ZERO_RETURN_IF_ERROR(guard.set(stream.device));
  return remember(cuda_status(cudaStreamSynchronize(native_stream), "cudaStreamSynchronize"));
}

absl::Status CudaApi::synchronize_device(int device) {
  ZERO_RETURN_IF_ERROR(failure());
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  return remember(cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
}

// From the device's stream-ordered pool: a free then needs no device-wide synchronization, which cudaFree would
// impose on every stream (communication included) each time the engine lets a bucket or gathered unit go.
absl::StatusOr<void*> CudaApi::allocate(size_t bytes, Stream stream) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_ASSIGN_OR_RETURN(cudaStream_t native_stream, native(stream));
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(stream.device));
  ZERO_RETURN_IF_ERROR(configure_pool(stream.device));
  void* ptr = nullptr;
  const cudaError_t err = cudaMallocAsync(&ptr, bytes, native_stream);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("allocating ", bytes, " bytes on cuda:", stream.device, " failed: device memory is full"));
  }
  ZERO_CUDA_RETURN_IF_ERROR(err);
  return ptr;
}

absl::Status CudaApi::free(void* ptr, Stream stream) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_ASSIGN_OR_RETURN(cudaStream_t native_stream, native(stream));
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(stream.device));
  ZERO_CUDA_RETURN_IF_ERROR(cudaFreeAsync(ptr, native_stream));
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaApi::allocate_pinned(size_t bytes) {
  ZERO_RETURN_IF_ERROR(failure());
  void* ptr = nullptr;
  ZERO_CUDA_RETURN_IF_ERROR(cudaMallocHost(&ptr, bytes));
  return ptr;
}

absl::Status CudaApi::free_pinned(void* ptr) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_CUDA_RETURN_IF_ERROR(cudaFreeHost(ptr));
  return absl::OkStatus();
}

absl::Status CudaApi::copy_async(void* dst, const void* src, size_t bytes, Stream stream) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_RETURN_IF_ERROR(refuse_pageable(dst, "destination"));
  ZERO_RETURN_IF_ERROR(refuse_pageable(src, "source"));
  ZERO_ASSIGN_OR_RETURN(cudaStream_t native_stream, native(stream));
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(stream.device));
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, native_stream));
  return absl::OkStatus();
}

absl::Status CudaApi::copy(void* dst, const void* src, size_t bytes) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_ASSIGN_OR_RETURN(const cudaPointerAttributes to, attributes(dst));
  ZERO_ASSIGN_OR_RETURN(const cudaPointerAttributes from, attributes(src));
  CudaDeviceGuard guard;  // cudaMemcpy queues on the current device's legacy stream: make it the device involved
  const cudaPointerAttributes& device_side = to.type == cudaMemoryTypeDevice ? to : from;
  if (device_side.type == cudaMemoryTypeDevice) ZERO_RETURN_IF_ERROR(guard.set(device_side.device));
  return remember(cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy"));
}

absl::Status CudaApi::launch(Stream stream, KernelLaunch launch) {
  ZERO_RETURN_IF_ERROR(failure());
  ZERO_ASSIGN_OR_RETURN(cudaStream_t native_stream, native(stream));
  ZERO_ASSIGN_OR_RETURN(const int current, cuda_current_device());
  if (stream.device != current) {
    return absl::InvalidArgumentError(absl::StrCat("launch ", launch.name, ": the stream is on cuda:", stream.device,
                                                   " but cuda:", current,
                                                   " is current, and CUDA launches only on the current device"));
  }
  ZERO_RETURN_IF_ERROR(remember(launch.body(CudaLaunchContext(native_stream, launch))));
  return remember(cuda_status(cudaGetLastError(), absl::StrCat("launch ", launch.name).c_str()));
}

absl::Status CudaApi::share_pool_memory(int a, int b) {
  ZERO_RETURN_IF_ERROR(failure());
  if (a == b) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(grant_pool_access(a, b));
  return grant_pool_access(b, a);
}

// The pool keeps what is freed for reuse (release threshold UINT64_MAX), so it grows to about the most that was live
// at once and stays: a step frees and allocates the same buckets and gathered units again, which the default
// threshold of 0 would hand back to the driver at every synchronization to be mapped again.
absl::Status CudaApi::configure_pool(int device) {
  absl::MutexLock lock(&pools_mu_);
  if (configured_pools_.contains(device)) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(cudaMemPool_t pool, default_pool(device));
  uint64_t keep_everything = UINT64_MAX;
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  configured_pools_.insert(device);
  return absl::OkStatus();
}

absl::StatusOr<cudaStream_t> CudaApi::native(Stream stream, bool take) {
  if (stream.id == 0) return cudaStreamLegacy;
  absl::MutexLock lock(&mu_);
  return look_up(streams_, {stream.device, stream.id}, take, "stream");
}

absl::StatusOr<cudaEvent_t> CudaApi::native(Event event, bool take) {
  absl::MutexLock lock(&mu_);
  return look_up(events_, {event.device, event.id}, take, "event");
}

absl::Status CudaApi::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

absl::Status CudaApi::remember(absl::Status status) {
  if (status.ok()) return status;
  absl::MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = status;
  return status;
}

CudaApi& cuda_api() {
  static auto* api = new CudaApi;
  return *api;
}

}  // namespace zero
