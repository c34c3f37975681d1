#include "runtime/cuda/stream.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "runtime/cuda/cuda_check.h"
#include "runtime/status.h"

namespace zero {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

namespace {

// "13.0" for CUDA's version number 13000.
std::string cuda_version_name(int version) { return absl::StrCat(version / 1000, ".", version % 1000 / 10); }

// The driver's CUDA version, 0 when no driver is loaded.
int driver_version() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return version;
}

}  // namespace

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

absl::StatusOr<CudaEvent> CudaEvent::create(int device) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  cudaEvent_t event = nullptr;
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return CudaEvent(device, event);
}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  std::swap(device_, other.device_);
  std::swap(event_, other.event_);
  return *this;
}

CudaEvent::~CudaEvent() {
  if (event_ == nullptr) return;
  CudaDeviceGuard guard;
  if (guard.set(device_).ok()) cudaEventDestroy(event_);
}

absl::Status CudaEvent::record(const CudaStream& stream) {
  if (stream.device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot record an event of cuda:", device_, " on a stream of cuda:", stream.device()));
  }
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device_));
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream.get()));
  return absl::OkStatus();
}

absl::Status CudaEvent::record_on_default_stream() {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device_));
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, cudaStreamLegacy));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaEvent::query() const {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  ZERO_CUDA_RETURN_IF_ERROR(err);
  return true;
}

absl::Status CudaEvent::synchronize(absl::Time deadline, const std::function<absl::Status()>& check) const {
  // Spin briefly for short collectives, then back off to at most 1 ms between polls.
  absl::Duration pause = absl::ZeroDuration();
  for (;;) {
    ZERO_ASSIGN_OR_RETURN(const bool done, query());
    if (done) return absl::OkStatus();
    if (check) ZERO_RETURN_IF_ERROR(check());
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("the CUDA work did not finish before the deadline");
    }
    if (pause == absl::ZeroDuration()) {
      std::this_thread::yield();
      pause = absl::Microseconds(1);
    } else {
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Milliseconds(1));
    }
  }
}

absl::StatusOr<CudaStream> CudaStream::create(int device) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  cudaStream_t stream = nullptr;
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return CudaStream(device, stream);
}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  std::swap(device_, other.device_);
  std::swap(stream_, other.stream_);
  return *this;
}

CudaStream::~CudaStream() {
  if (stream_ == nullptr) return;
  CudaDeviceGuard guard;
  if (guard.set(device_).ok()) cudaStreamDestroy(stream_);
}

absl::Status CudaStream::wait(const CudaEvent& event) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device_));
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, event.get(), 0));
  return absl::OkStatus();
}

absl::Status CudaStream::wait_for_default_stream(CudaEvent& marker) {
  if (marker.device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot order a stream of cuda:", device_, " with an event of cuda:", marker.device()));
  }
  ZERO_RETURN_IF_ERROR(marker.record_on_default_stream());
  return wait(marker);
}

absl::Status CudaStream::synchronize(absl::Time deadline) {
  ZERO_ASSIGN_OR_RETURN(CudaEvent event, CudaEvent::create(device_));
  ZERO_RETURN_IF_ERROR(event.record(*this));
  return event.synchronize(deadline);
}

}  // namespace zero
