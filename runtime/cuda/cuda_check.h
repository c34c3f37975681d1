// CUDA error checking that turns a cudaError_t into an absl::Status naming the call.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zero {

inline absl::Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

}  // namespace zero

#define ZERO_CUDA_RETURN_IF_ERROR(expr)                                             \
  do {                                                                              \
    if (absl::Status _st = ::zero::cuda_status((expr), #expr); !_st.ok()) return _st; \
  } while (0)
