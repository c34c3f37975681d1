// matmul forward/backward on CUDA: fp32 cuBLAS GEMMs (no TF32), bias broadcast and deterministic bias gradient.
#include <cublas_v2.h>

#include <unordered_map>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

absl::Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")"));
}

#define ZERO_CUBLAS_RETURN_IF_ERROR(expr) ZERO_RETURN_IF_ERROR(cublas_status((expr), #expr))

// One cuBLAS handle per (thread, device), as cuBLAS recommends for multi-threaded callers; created on first
// use with the device current, destroyed when the thread exits.
class ThreadHandles {
 public:
  ~ThreadHandles() {
    for (auto& [device, h] : handles_) cublasDestroy(h);
  }
  absl::StatusOr<cublasHandle_t> get(int device) {
    if (auto it = handles_.find(device); it != handles_.end()) return it->second;
    cublasHandle_t h = nullptr;
    ZERO_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h));
    handles_[device] = h;
    // fp32 in, fp32 products and sums: no TF32, so results differ from the CPU only by summation order.
    ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, 0));
    return h;
  }

 private:
  std::unordered_map<int, cublasHandle_t> handles_;
};

absl::StatusOr<cublasHandle_t> handle(int device) {
  thread_local ThreadHandles handles;
  return handles.get(device);
}

// Row-major C (M, N) = op(A) · op(B) is column-major C^T = op(B)^T · op(A)^T, so every call below passes
// the operands swapped: cuBLAS sees each row-major (R, K) matrix as a column-major (K, R) one.
absl::Status gemm(cublasHandle_t h, cublasOperation_t op_b, cublasOperation_t op_a, int64_t n, int64_t m, int64_t k,
                  const float* b, int64_t ldb, const float* a, int64_t lda, float beta, float* c, int64_t ldc) {
  const float one = 1.0f;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasSgemm_64(h, op_b, op_a, n, m, k, &one, b, ldb, a, lda, &beta, c, ldc));
  return absl::OkStatus();
}

// out (N, OC) row r = bias (OC).
__global__ void broadcast_rows_kernel(float* out, const float* bias, int64_t n, int64_t oc) {
  ZERO_GRID_STRIDE(i, n * oc) out[i] = bias[i % oc];
}

}  // namespace

absl::Status matmul_forward(int device, float* out, const float* inp, const float* weight, const float* bias,
                            int64_t n, int64_t c, int64_t oc) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(cublasHandle_t h, handle(device));
  if (bias != nullptr) {
    broadcast_rows_kernel<<<blocks_for(n * oc), kThreads>>>(out, bias, n, oc);
    ZERO_RETURN_IF_ERROR(launched("broadcast_rows_kernel"));
  }
  // out (N, OC) = inp (N, C) · weight^T (C, OC) [+ out holding the bias]
  return gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, c, weight, c, inp, c, bias != nullptr ? 1.0f : 0.0f, out, oc);
}

absl::Status matmul_backward(int device, float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, int64_t n, int64_t c, int64_t oc) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(cublasHandle_t h, handle(device));
  if (dinp != nullptr) {
    // dinp (N, C) = dout (N, OC) · weight (OC, C)
    ZERO_RETURN_IF_ERROR(gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, c, n, oc, weight, c, dout, oc, 0.0f, dinp, c));
  }
  // dweight (OC, C) += dout^T (OC, N) · inp (N, C)
  ZERO_RETURN_IF_ERROR(gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, c, oc, n, inp, c, dout, oc, 1.0f, dweight, c));
  if (dbias == nullptr) return absl::OkStatus();
  return add_column_sums(n, oc, dbias, MatrixElement{dout, oc});
}

}  // namespace zero::kernels::cuda
