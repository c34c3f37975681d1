// Access across GPUs to the devices' stream-ordered memory pools, where the Allocator's CUDA memory comes from
// (CudaApi sets them up and implements this).
#pragma once

#include "absl/status/status.h"

namespace zero {

// Lets GPUs `a` and `b` (both in this process) read and write each other's pool memory, where the
// hardware allows it. NCCL reads the buffers of the other GPUs of its process directly, which pool
// memory allows only once its pool grants the access (cudaMemPoolSetAccess); cudaMalloc memory needed
// just peer access. Called by the nccl backend for each pair of GPUs its ranks in one process use.
absl::Status share_pool_memory(int a, int b);

}  // namespace zero
