// cuBLAS and cuBLASLt handles, configured for the kernels' GEMMs and lent per (thread, device) by ThreadHandles.
#include "kernels/cuda/cublas_handle.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/handle_pool.h"

namespace zero::kernels::cuda {

absl::Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")"));
}

cudaDataType_t cuda_data_type(DType t) {
  return t == DType::kBF16 ? CUDA_R_16BF : t == DType::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

namespace {

// fp32 in, fp32 products and sums: the default math keeps cublasSgemm off TF32, so results differ from the CPU only
// by summation order (kernels::Fp32Gemm::kTf32 asks for TF32 per call, through the compute type).
// bf16/fp16 in (cublasGemmEx, compute 32F): tensor cores, products exact in fp32 and summed in fp32; the
// DISALLOW flag keeps split-K partial sums in fp32 too (by default cuBLAS may reduce them in a half C's
// dtype), so a half output is rounded exactly once. It changes nothing for fp32 outputs.
absl::Status configure(cublasHandle_t h) {
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
      h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, 0));
  return absl::OkStatus();
}

// A new handle of the current device.
absl::StatusOr<cublasHandle_t> create_handle() {
  cublasHandle_t h = nullptr;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h));
  if (absl::Status s = configure(h); !s.ok()) {
    cublasDestroy(h);
    return s;
  }
  return h;
}

absl::StatusOr<cublasLtHandle_t> create_lt_handle() {
  cublasLtHandle_t h = nullptr;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&h));
  return h;
}

}  // namespace

absl::StatusOr<cublasHandle_t> cublas_handle(int device) {
  return ThreadHandles<cublasHandle_t, create_handle>::get(device);
}

absl::StatusOr<cublasLtHandle_t> cublaslt_handle(int device) {
  return ThreadHandles<cublasLtHandle_t, create_lt_handle>::get(device);
}

}  // namespace zero::kernels::cuda
