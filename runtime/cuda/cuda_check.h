// CUDA error checking that turns a cudaError_t into an absl::Status naming the call, and a current-device guard.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zero {

// Internal for runtime failures; FailedPrecondition when there is no usable device or driver, since
// that is fixed by where the program runs, not by retrying.
inline absl::Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear the non-sticky error so later calls do not report it again
  const std::string message = absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorInvalidDevice) {
    return absl::FailedPreconditionError(message);
  }
  return absl::InternalError(message);
}

// Makes `device` current for this thread for the guard's lifetime, then restores the previous one, so
// helpers that pick a device do not change the caller's.
class CudaDeviceGuard {
 public:
  CudaDeviceGuard() = default;
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;
  ~CudaDeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

  absl::Status set(int device) {
    if (previous_ < 0 && cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    return cuda_status(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")").c_str());
  }

 private:
  int previous_ = -1;
};

}  // namespace zero

#define ZERO_CUDA_RETURN_IF_ERROR(expr)                                               \
  do {                                                                                \
    if (absl::Status _st = ::zero::cuda_status((expr), #expr); !_st.ok()) return _st; \
  } while (0)
