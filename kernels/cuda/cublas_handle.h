// cuBLAS and cuBLASLt handles for the CUDA kernels: one per (thread, device), lent by a pool that lives as long as the
// process.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

namespace zero::kernels::cuda {

// OK, or an Internal error naming the call and cuBLAS's status.
absl::Status cublas_status(cublasStatus_t s, const char* what);

// cuBLAS's data type for a floating dtype (fp32, bf16, fp16).
cudaDataType_t cuda_data_type(DType t);

#define ZERO_CUBLAS_RETURN_IF_ERROR(expr) ZERO_RETURN_IF_ERROR(::zero::kernels::cuda::cublas_status((expr), #expr))

// This thread's handle for `device`, which must be current: cuBLAS asks multi-threaded callers for a handle
// per thread. Its caller sets its stream (matmul.cu: the current stream); fp32 GEMMs without TF32 unless a call's
// compute type asks for it, and half GEMMs with fp32 sums.
// The first call on a thread borrows one from the pool (made there when none is free); the thread gives it
// back when it exits, for the next thread, since local ranks are threads started anew for each run.
absl::StatusOr<cublasHandle_t> cublas_handle(int device);

// This thread's cuBLASLt handle for `device` (matmul.cu's GEMMs with a fused epilogue), lent as above and left
// unconfigured: each call names its stream, and keeps split-K sums in fp32 through its own reduction-scheme mask.
absl::StatusOr<cublasLtHandle_t> cublaslt_handle(int device);

}  // namespace zero::kernels::cuda
