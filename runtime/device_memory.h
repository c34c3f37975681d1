// Raw allocation on a device; the Allocator is the only caller and does the accounting.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "runtime/device.h"

namespace zero {

// CPU: 64-byte aligned host memory. CUDA: cudaMalloc.
absl::StatusOr<void*> device_alloc(Device device, size_t nbytes);
void device_free(Device device, void* ptr);

}  // namespace zero
