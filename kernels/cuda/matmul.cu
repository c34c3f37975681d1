// matmul forward/backward on CUDA: fp32 cuBLAS GEMMs (TF32 on request), bf16/fp16 tensor-core GEMMs with fp32
// accumulation (a half output's bias, residual and GELU in cuBLASLt's epilogue; a half dinp's GELU backward and a half
// dweight's += on an fp32 product), bias and deterministic bias gradient.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas_handle.h"
#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gelu.cuh"
#include "runtime/cuda/half.cuh"
#include "runtime/dtype_dispatch.h"

namespace zero::kernels::cuda {
namespace {

// run(handle) through library_call, the thread's cuBLAS handle set to the current stream.
template <typename Run>
absl::Status on_current_stream(int device, const char* name, Run&& run) {
  ZERO_ASSIGN_OR_RETURN(const cublasHandle_t h, cublas_handle(device));
  return library_call(current_cuda_stream(device), name, [&](cudaStream_t stream) {
    ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, stream));
    return run(h);
  });
}

// Row-major C (M, N) = op(A) · op(B) is column-major C^T = op(B)^T · op(A)^T, so every call below passes
// the operands swapped: cuBLAS sees each row-major (R, K) matrix as a column-major (K, R) one. tf32: on tensor
// cores with the operands rounded to TF32 (CUBLAS_COMPUTE_32F_FAST_TF32), else fp32 throughout.
absl::Status gemm(int device, bool tf32, cublasOperation_t op_b, cublasOperation_t op_a, int64_t n, int64_t m,
                  int64_t k, const float* b, int64_t ldb, const float* a, int64_t lda, float beta, float* c,
                  int64_t ldc) {
  return on_current_stream(device, "gemm", [&](cublasHandle_t h) {
    const float one = 1.0f;
    if (tf32) {
      ZERO_CUBLAS_RETURN_IF_ERROR(cublasGemmEx_64(h, op_b, op_a, n, m, k, &one, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda,
                                                  &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_TF32,
                                                  CUBLAS_GEMM_DEFAULT));
    } else {
      ZERO_CUBLAS_RETURN_IF_ERROR(cublasSgemm_64(h, op_b, op_a, n, m, k, &one, b, ldb, a, lda, &beta, c, ldc));
    }
    return absl::OkStatus();
  });
}

// out (N, OC) row r = bias (OC).
__global__ void broadcast_rows_kernel(float* out, const float* bias, int64_t n, int64_t oc) {
  ZERO_GRID_STRIDE(i, n * oc) out[i] = bias[i % oc];
}

// ---- bf16 / fp16 operands ----

// The gemm above for half A and B (dtype `ab`) and a C of dtype `ct` (fp32 or `ab`): fp32 accumulation
// (CUBLAS_COMPUTE_32F), alpha and beta fp32, tensor cores allowed (CUBLAS_GEMM_DEFAULT picks them).
absl::Status gemm_ex(int device, cublasOperation_t op_b, cublasOperation_t op_a, int64_t n, int64_t m, int64_t k,
                     const void* b, int64_t ldb, const void* a, int64_t lda, DType ab, float beta, void* c, DType ct,
                     int64_t ldc) {
  return on_current_stream(device, "gemm_ex", [&](cublasHandle_t h) {
    const float one = 1.0f;
    ZERO_CUBLAS_RETURN_IF_ERROR(cublasGemmEx_64(h, op_b, op_a, n, m, k, &one, b, cuda_data_type(ab), ldb, a,
                                                cuda_data_type(ab), lda, &beta, c, cuda_data_type(ct), ldc,
                                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  });
}

// The CUDA element type of the floating dtype a visit_floating constant names.
template <typename DTypeTag>
using Element = DeviceElement<DTypeTag::value>;

// out (N, OC) row r = bias (OC) widened to fp32.
template <typename Bias>
__global__ void broadcast_widen_kernel(float* out, const Bias* bias, int64_t n, int64_t oc) {
  ZERO_GRID_STRIDE(i, n * oc) out[i] = widen(bias[i % oc]);
}

// The forward epilogue cuBLASLt would have run, on an fp32 product acc (N, OC): s = acc + bias (OC) + residual (N, OC)
// in fp32, in the CPU's order (matmul_forward, then residual_forward), the bias and residual where not null; then
// out = round(s), or with gelu_pre, gelu_pre = round(s) and out = round(GELU(s)).
template <typename Out, typename Bias>
__global__ void epilogue_narrow_kernel(Out* out, Out* gelu_pre, const float* acc, const Out* residual, const Bias* bias,
                                       int64_t n, int64_t oc) {
  ZERO_GRID_STRIDE(i, n * oc) {
    float s = acc[i];
    if (bias != nullptr) s += widen(bias[i % oc]);
    if (residual != nullptr) s += widen(residual[i]);
    if (gelu_pre != nullptr) {
      gelu_pre[i] = narrow<Out>(s);
      s = gelu(s);
    }
    out[i] = narrow<Out>(s);
  }
}

// product(acc), a GEMM alone, into an fp32 scratch of `elems` (with_scratch), then finish(acc), its epilogue with the
// one rounding.
template <typename Product, typename Finish>
absl::Status unfused(int device, int64_t elems, Product&& product, Finish&& finish) {
  return with_scratch(device, elems * sizeof(float), [&](void* scratch) {
    float* acc = static_cast<float*>(scratch);
    absl::Status s = product(acc);
    if (s.ok()) s.Update(finish(acc));
    return s;
  });
}

// g with its epilogue in cuBLASLt; where lt_gemm refuses it (NotFound), the same unfused.
template <typename Product, typename Finish>
absl::Status in_epilogue_or_unfused(int device, DType half, const LtGemm& g, int64_t elems, Product&& product,
                                    Finish&& finish) {
  if (const absl::Status fused = lt_gemm(device, half, g); !absl::IsNotFound(fused)) return fused;
  return unfused(device, elems, std::forward<Product>(product), std::forward<Finish>(finish));
}

// fn(p), p being dst itself where it is kLtAlignment-aligned, else an aligned stream-ordered copy of its `bytes`,
// copied back after: a GEMM accumulating into dst then has its algorithm, and so its bits, chosen by the problem
// alone, not by where dst lies (a stage-0 gradient bucket packs units at offsets that need not be 16-byte aligned, so
// the same weight gradient lies differently from stage to stage).
template <typename Fn>
absl::Status on_aligned(int device, void* dst, size_t bytes, Fn&& fn) {
  if (reinterpret_cast<uintptr_t>(dst) % kLtAlignment == 0) return fn(dst);
  return with_scratch(device, bytes, [&](void* copy) {
    const Stream stream = current_cuda_stream(device);
    ZERO_RETURN_IF_ERROR(cuda_api().copy_async(copy, dst, bytes, stream));
    ZERO_RETURN_IF_ERROR(fn(copy));
    return cuda_api().copy_async(dst, copy, bytes, stream);
  });
}

// dst (N, C) = dout (N, OC) · weight (OC, C), as gemm's swapped operands: weight and dout in `half`.
absl::Status input_gradient(int device, void* dst, DType dst_dtype, const void* dout, const void* weight, DType half,
                            int64_t n, int64_t c, int64_t oc) {
  return gemm_ex(device, CUBLAS_OP_N, CUBLAS_OP_N, c, n, oc, weight, c, dout, oc, half, 0.0f, dst, dst_dtype, c);
}

// dst (OC, C) = dout^T (OC, N) · inp (N, C) [+ dst, beta = 1], as gemm's swapped operands: inp and dout in `half`.
absl::Status weight_gradient(int device, void* dst, DType dst_dtype, float beta, const void* dout, const void* inp,
                             DType half, int64_t n, int64_t c, int64_t oc) {
  return gemm_ex(device, CUBLAS_OP_N, CUBLAS_OP_T, c, oc, n, inp, c, dout, oc, half, beta, dst, dst_dtype, c);
}

// A half dweight (OC, C) += dout^T · inp, the sum added to dweight in fp32 and rounded once, through an fp32 scratch.
// On an H200 (cuBLAS 13) a beta = 1 into a half C rounded twice, up to one ulp off: cuBLAS's own, and cuBLASLt's
// epilogue with C as D on a 96-row problem that it did not split over K.
absl::Status accumulate_half_weight_gradient(int device, void* dweight, DType dweight_dtype, const void* dout,
                                             const void* inp, DType half, int64_t n, int64_t c, int64_t oc) {
  return unfused(
      device, oc * c,
      [&](float* acc) { return weight_gradient(device, acc, DType::kF32, 0.0f, dout, inp, half, n, c, oc); },
      [&](const float* acc) { return add_into(device, dweight, acc, dweight_dtype, DType::kF32, oc * c); });
}

// dinp (N, C) = round(GELU'(gelu_pre) · dout (N, OC) · weight (OC, C)), the product's fp32 sum multiplied before the
// one rounding, through an fp32 scratch. dinp and gelu_pre in `half`. cuBLASLt's DGELU epilogue rounded the product to
// bf16 before multiplying on an H200 (cuBLAS 13).
absl::Status input_gradient_through_gelu(int device, void* dinp, const void* gelu_pre, const void* dout,
                                         const void* weight, DType half, int64_t n, int64_t c, int64_t oc) {
  return unfused(
      device, n * c, [&](float* acc) { return input_gradient(device, acc, DType::kF32, dout, weight, half, n, c, oc); },
      [&](const float* acc) { return gelu_backward(device, dinp, gelu_pre, acc, half, DType::kF32, n * c); });
}

}  // namespace

absl::Status matmul_forward(int device, float* out, const float* inp, const float* weight, const float* bias, int64_t n,
                            int64_t c, int64_t oc, bool tf32) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  if (bias != nullptr) {
    ZERO_RETURN_IF_ERROR(launch_kernel(device, "broadcast_rows_kernel", broadcast_rows_kernel, blocks_for(n * oc),
                                       kThreads, out, bias, n, oc));
  }
  // out (N, OC) = inp (N, C) · weight^T (C, OC) [+ out holding the bias]
  return gemm(device, tf32, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, c, weight, c, inp, c, bias != nullptr ? 1.0f : 0.0f, out,
              oc);
}

absl::Status matmul_backward(int device, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, int64_t n, int64_t c, int64_t oc, bool tf32) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  if (dinp != nullptr) {
    // dinp (N, C) = dout (N, OC) · weight (OC, C)
    ZERO_RETURN_IF_ERROR(gemm(device, tf32, CUBLAS_OP_N, CUBLAS_OP_N, c, n, oc, weight, c, dout, oc, 0.0f, dinp, c));
  }
  // dweight (OC, C) += dout^T (OC, N) · inp (N, C)
  ZERO_RETURN_IF_ERROR(on_aligned(device, dweight, oc * c * sizeof(float), [&](void* dst) {
    return gemm(device, tf32, CUBLAS_OP_N, CUBLAS_OP_T, c, oc, n, inp, c, dout, oc, 1.0f, static_cast<float*>(dst), c);
  }));
  if (dbias == nullptr) return absl::OkStatus();
  return add_column_sums<DType::kF32>(device, n, oc, {dbias}, MatrixColumns<DType::kF32>{dout, oc});
}

absl::Status matmul_forward_half(int device, void* out, DType out_dtype, void* gelu_pre, const void* residual,
                                 const void* inp, const void* weight, const void* bias, DType bias_dtype, DType half,
                                 int64_t n, int64_t c, int64_t oc) {
  ZERO_CHECK((gelu_pre == nullptr && residual == nullptr) || out_dtype == half,
             "matmul_forward_half: GELU's out and pre, or the residual and out, in ", dtype_name(half));
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  // out (N, OC) = inp (N, C) · weight^T (C, OC), as matmul_forward's gemm.
  const auto product = [&](void* dst, DType dst_dtype, float beta) {
    return gemm_ex(device, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, c, weight, c, inp, c, half, beta, dst, dst_dtype, oc);
  };
  if (bias == nullptr && gelu_pre == nullptr && residual == nullptr) return product(out, out_dtype, 0.0f);
  return visit_floating(bias != nullptr ? bias_dtype : DType::kF32, [&](auto bias_type) -> absl::Status {
    using Bias = Element<decltype(bias_type)>;
    const Bias* b = static_cast<const Bias*>(bias);
    if (out_dtype == DType::kF32) {
      // fp32 out: bias broadcast, then the GEMM adds the products to it in fp32 (beta = 1).
      ZERO_RETURN_IF_ERROR(launch_kernel(device, "broadcast_widen_kernel", broadcast_widen_kernel<Bias>,
                                         blocks_for(n * oc), kThreads, static_cast<float*>(out), b, n, oc));
      return product(out, DType::kF32, 1.0f);
    }
    // Half out: as product's gemm_ex, D (OC, N) = weight^T · inp [+ C, the residual], the bias along D's rows.
    return in_epilogue_or_unfused(
        device, half,
        LtGemm{.transpose_a = true,
               .m = oc,
               .n = n,
               .k = c,
               .a = weight,
               .lda = c,
               .b = inp,
               .ldb = c,
               .d = out,
               .d_dtype = out_dtype,
               .ldd = oc,
               .bias = bias,
               .bias_dtype = bias_dtype,
               .gelu_pre = gelu_pre,
               .c = residual},
        n * oc, [&](float* acc) { return product(acc, DType::kF32, 0.0f); },
        [&](const float* acc) {
          return visit_floating(out_dtype, [&](auto out_type) {
            using Out = Element<decltype(out_type)>;
            return launch_kernel(device, "epilogue_narrow_kernel", epilogue_narrow_kernel<Out, Bias>,
                                 blocks_for(n * oc), kThreads, static_cast<Out*>(out), static_cast<Out*>(gelu_pre), acc,
                                 static_cast<const Out*>(residual), b, n, oc);
          });
        });
  });
}

absl::Status matmul_backward_half(int device, void* dinp, DType dinp_dtype, const void* gelu_pre, void* dweight,
                                  DType dweight_dtype, void* dbias, DType dbias_dtype, const void* dout,
                                  const void* inp, const void* weight, DType half, int64_t n, int64_t c, int64_t oc) {
  ZERO_CHECK(gelu_pre == nullptr || (dinp != nullptr && dinp_dtype == half),
             "matmul_backward_half: GELU's dinp and pre in ", dtype_name(half));
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  if (gelu_pre != nullptr) {
    ZERO_RETURN_IF_ERROR(input_gradient_through_gelu(device, dinp, gelu_pre, dout, weight, half, n, c, oc));
  } else if (dinp != nullptr) {
    ZERO_RETURN_IF_ERROR(input_gradient(device, dinp, dinp_dtype, dout, weight, half, n, c, oc));
  }
  // dweight (OC, C) += dout^T (OC, N) · inp (N, C): an fp32 dweight takes the sum through beta = 1, a half one's GEMM
  // writes an aligned scratch.
  if (dweight_dtype == DType::kF32) {
    ZERO_RETURN_IF_ERROR(on_aligned(device, dweight, oc * c * sizeof(float), [&](void* dst) {
      return weight_gradient(device, dst, DType::kF32, 1.0f, dout, inp, half, n, c, oc);
    }));
  } else {
    ZERO_RETURN_IF_ERROR(accumulate_half_weight_gradient(device, dweight, dweight_dtype, dout, inp, half, n, c, oc));
  }
  if (dbias == nullptr) return absl::OkStatus();
  return visit_floating(half, [&](auto in) {
    return visit_floating(dbias_dtype, [&](auto out) {
      return add_column_sums<decltype(out)::value>(device, n, oc, {dbias},
                                                   MatrixColumns<decltype(in)::value>{dout, oc});
    });
  });
}

}  // namespace zero::kernels::cuda
