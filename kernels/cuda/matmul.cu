// matmul forward/backward on CUDA: fp32 cuBLAS GEMMs (TF32 on request), bf16/fp16 tensor-core GEMMs with fp32
// accumulation (a half output's bias in cuBLASLt's epilogue), bias and deterministic bias gradient.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>
#include <optional>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas_handle.h"
#include "kernels/cuda/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

// run(stream) (an absl::Status) as a launch on cuda:`device`'s current stream. A library's error (a bad argument, no
// workspace) is returned, not kept by the launch as the device's sticky failure.
template <typename Run>
absl::Status library_call(int device, const char* name, Run&& run) {
  absl::Status result = absl::OkStatus();
  ZERO_RETURN_IF_ERROR(launch_on_stream(current_cuda_stream(device), name, [&](cudaStream_t stream) {
    result.Update(run(stream));
    return absl::OkStatus();
  }));
  return result;
}

// run(handle) through library_call, the thread's cuBLAS handle set to the current stream.
template <typename Run>
absl::Status on_current_stream(int device, const char* name, Run&& run) {
  ZERO_ASSIGN_OR_RETURN(const cublasHandle_t h, cublas_handle(device));
  return library_call(device, name, [&](cudaStream_t stream) {
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

cudaDataType_t cuda_type(DType t) {
  return t == DType::kBF16 ? CUDA_R_16BF : t == DType::kF16 ? CUDA_R_16F : CUDA_R_32F;
}

// The gemm above for half A and B (dtype `ab`) and a C of dtype `ct` (fp32 or `ab`): fp32 accumulation
// (CUBLAS_COMPUTE_32F), alpha and beta fp32, tensor cores allowed (CUBLAS_GEMM_DEFAULT picks them).
absl::Status gemm_ex(int device, cublasOperation_t op_b, cublasOperation_t op_a, int64_t n, int64_t m, int64_t k,
                     const void* b, int64_t ldb, const void* a, int64_t lda, DType ab, float beta, void* c, DType ct,
                     int64_t ldc) {
  return on_current_stream(device, "gemm_ex", [&](cublasHandle_t h) {
    const float one = 1.0f;
    ZERO_CUBLAS_RETURN_IF_ERROR(cublasGemmEx_64(h, op_b, op_a, n, m, k, &one, b, cuda_type(ab), ldb, a, cuda_type(ab),
                                                lda, &beta, c, cuda_type(ct), ldc, CUBLAS_COMPUTE_32F,
                                                CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  });
}

// ---- cuBLASLt: the bias added in the GEMM's epilogue ----

// cuBLASLt's descriptors, destroyed on every path.
struct LtDestroy {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
template <typename Descriptor>
using LtOwned = std::unique_ptr<std::remove_pointer_t<Descriptor>, LtDestroy>;

// A column-major (rows, cols) matrix of `t` with leading dimension ld.
absl::StatusOr<LtOwned<cublasLtMatrixLayout_t>> lt_layout(DType t, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&layout, cuda_type(t), rows, cols, ld));
  return LtOwned<cublasLtMatrixLayout_t>(layout);
}

template <typename Value>
absl::Status set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const Value& value) {
  return cublas_status(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)),
                       "cublasLtMatmulDescSetAttribute");
}
template <typename Value>
absl::Status set_attribute(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute,
                           const Value& value) {
  return cublas_status(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)),
                       "cublasLtMatmulPreferenceSetAttribute");
}

// What the cuBLASLt path asks of every pointer, and tells the heuristic: 16 bytes, what its kernels' vector and TMA
// loads need. Pinned rather than read from the addresses, so the algorithm, and with it the bits, depend on the
// problem alone and not on where its buffers happen to lie (a gathered unit, a recomputed block).
constexpr uint32_t kLtAlignment = 16;

// The workspace a cuBLASLt GEMM may take, as llm.c and PyTorch give it; stream-ordered scratch for the call.
constexpr uint64_t kLtWorkspaceBytes = uint64_t{32} << 20;

// One bias-epilogue GEMM problem on a device: all the heuristic's choice depends on.
struct LtProblem {
  int device;
  int64_t n, c, oc;
  DType half, out;
  bool operator==(const LtProblem&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const LtProblem& p) {
    return H::combine(std::move(h), p.device, p.n, p.c, p.oc, p.half, p.out);
  }
};

// The heuristic's best algorithm for `problem`, asked once per process (none: cuBLASLt offers none for it).
absl::StatusOr<std::optional<cublasLtMatmulHeuristicResult_t>> lt_algorithm(
    const LtProblem& problem, cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* chosen = new absl::flat_hash_map<LtProblem, std::optional<cublasLtMatmulHeuristicResult_t>>;
  absl::MutexLock lock(&mu);
  if (const auto it = chosen->find(problem); it != chosen->end()) return it->second;
  cublasLtMatmulPreference_t raw_pref = nullptr;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw_pref));
  const LtOwned<cublasLtMatmulPreference_t> pref(raw_pref);
  ZERO_RETURN_IF_ERROR(set_attribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kLtWorkspaceBytes));
  ZERO_RETURN_IF_ERROR(set_attribute(pref.get(), CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                     static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)));
  for (const auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    ZERO_RETURN_IF_ERROR(set_attribute(pref.get(), attribute, kLtAlignment));
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t query = cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, d, d, pref.get(), 1, &heuristic, &found);
  if (query != CUBLAS_STATUS_NOT_SUPPORTED)
    ZERO_RETURN_IF_ERROR(cublas_status(query, "cublasLtMatmulAlgoGetHeuristic"));
  std::optional<cublasLtMatmulHeuristicResult_t> result;
  if (query == CUBLAS_STATUS_SUCCESS && found > 0 && heuristic.state == CUBLAS_STATUS_SUCCESS) result = heuristic;
  chosen->emplace(problem, result);
  return result;
}

// out (N, OC) = round(inp (N, C) · weight^T (C, OC) + bias (OC)), inp and weight in `half`, bias and out in
// `out_dtype`: cuBLASLt's bias epilogue adds the bias to the fp32 sums and rounds once into out. Split-K partials
// stay fp32 (the reduction scheme mask), as the cuBLAS handle's DISALLOW flag asks of cublasGemmEx. NotFound, with
// nothing queued, where a pointer is not 16-byte aligned or cuBLASLt offers no algorithm: the caller takes the
// unfused path.
absl::Status gemm_bias_epilogue(int device, void* out, DType out_dtype, const void* inp, const void* weight,
                                const void* bias, DType half, int64_t n, int64_t c, int64_t oc) {
  for (const void* p : {static_cast<const void*>(out), inp, weight, bias}) {
    if (reinterpret_cast<uintptr_t>(p) % kLtAlignment != 0) {
      return absl::NotFoundError("the bias-epilogue GEMM needs 16-byte-aligned tensors");
    }
  }
  ZERO_ASSIGN_OR_RETURN(const cublasLtHandle_t h, cublaslt_handle(device));
  cublasLtMatmulDesc_t raw_desc = nullptr;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const LtOwned<cublasLtMatmulDesc_t> desc(raw_desc);
  // Column-major as gemm() sees it: D (OC, N) = A^T · B, A = weight as (C, OC), B = inp as (C, N); bias per row of D.
  ZERO_RETURN_IF_ERROR(set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T));
  ZERO_RETURN_IF_ERROR(set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N));
  ZERO_RETURN_IF_ERROR(set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS));
  ZERO_RETURN_IF_ERROR(set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
  ZERO_RETURN_IF_ERROR(
      set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type(out_dtype))));
  ZERO_ASSIGN_OR_RETURN(const auto a, lt_layout(half, c, oc, c));
  ZERO_ASSIGN_OR_RETURN(const auto b, lt_layout(half, c, n, c));
  ZERO_ASSIGN_OR_RETURN(const auto d, lt_layout(out_dtype, oc, n, oc));
  ZERO_ASSIGN_OR_RETURN(const auto algorithm,
                        lt_algorithm({device, n, c, oc, half, out_dtype}, h, desc.get(), a.get(), b.get(), d.get()));
  if (!algorithm.has_value()) return absl::NotFoundError("cuBLASLt offers no bias-epilogue GEMM for this shape");
  const auto matmul = [&](void* workspace) {
    return library_call(device, "gemm_bias_epilogue", [&](cudaStream_t stream) {
      const float one = 1.0f, zero = 0.0f;
      const cublasStatus_t status =
          cublasLtMatmul(h, desc.get(), &one, weight, a.get(), inp, b.get(), &zero, out, d.get(), out, d.get(),
                         &algorithm->algo, workspace, algorithm->workspaceSize, stream);
      if (status == CUBLAS_STATUS_NOT_SUPPORTED) return absl::NotFoundError("cuBLASLt refused its own algorithm");
      return cublas_status(status, "cublasLtMatmul");
    });
  };
  if (algorithm->workspaceSize == 0) return matmul(nullptr);
  return with_scratch(device, algorithm->workspaceSize, matmul);
}

// Calls f with a null T* for the C++ type T that `t` names (fp32, bf16 or fp16): the launchers below
// dispatch on runtime dtypes with it.
template <typename F>
absl::Status with_type(DType t, F&& f) {
  switch (t) {
    case DType::kF32: return f(static_cast<float*>(nullptr));
    case DType::kBF16: return f(static_cast<__nv_bfloat16*>(nullptr));
    case DType::kF16: return f(static_cast<__half*>(nullptr));
    default: return absl::InternalError(absl::StrCat("matmul: no CUDA GEMM for ", dtype_name(t)));
  }
}

template <typename P>
using Pointee = std::remove_pointer_t<P>;

// out (N, OC) row r = bias (OC) widened to fp32.
template <typename Bias>
__global__ void broadcast_widen_kernel(float* out, const Bias* bias, int64_t n, int64_t oc) {
  ZERO_GRID_STRIDE(i, n * oc) out[i] = widen(bias[i % oc]);
}

// out (N, OC) = round(acc (N, OC) + bias (OC)): the bias added in fp32, then one rounding into Out.
template <typename Out, typename Bias>
__global__ void add_bias_narrow_kernel(Out* out, const float* acc, const Bias* bias, int64_t n, int64_t oc) {
  ZERO_GRID_STRIDE(i, n * oc) out[i] = narrow<Out>(acc[i] + widen(bias[i % oc]));
}

// out (n) = round(out + acc (n)): an fp32 sum added to a half accumulator in fp32, one rounding.
template <typename Out>
__global__ void accumulate_narrow_kernel(Out* out, const float* acc, int64_t n) {
  ZERO_GRID_STRIDE(i, n) out[i] = narrow<Out>(widen(out[i]) + acc[i]);
}

// product(acc) into an fp32 scratch of `elems` (with_scratch), then finish(acc): how a half result gets a GEMM's
// fp32 sum and something more with one rounding.
template <typename Product, typename Finish>
absl::Status through_fp32_scratch(int device, int64_t elems, Product&& product, Finish&& finish) {
  return with_scratch(device, elems * sizeof(float), [&](void* scratch) {
    float* acc = static_cast<float*>(scratch);
    absl::Status s = product(acc);
    if (s.ok()) s.Update(finish(acc));
    return s;
  });
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
  ZERO_RETURN_IF_ERROR(gemm(device, tf32, CUBLAS_OP_N, CUBLAS_OP_T, c, oc, n, inp, c, dout, oc, 1.0f, dweight, c));
  if (dbias == nullptr) return absl::OkStatus();
  return add_column_sums(device, n, oc, dbias, MatrixElement<float>{dout, oc});
}

absl::Status matmul_forward_half(int device, void* out, DType out_dtype, const void* inp, const void* weight,
                                 const void* bias, DType bias_dtype, DType half, int64_t n, int64_t c, int64_t oc) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  // out (N, OC) = inp (N, C) · weight^T (C, OC), as matmul_forward's gemm.
  const auto product = [&](void* dst, DType dst_dtype, float beta) {
    return gemm_ex(device, CUBLAS_OP_T, CUBLAS_OP_N, oc, n, c, weight, c, inp, c, half, beta, dst, dst_dtype, oc);
  };
  if (bias == nullptr) return product(out, out_dtype, 0.0f);
  return with_type(bias_dtype, [&](auto* bias_tag) -> absl::Status {
    using Bias = Pointee<decltype(bias_tag)>;
    const Bias* b = static_cast<const Bias*>(bias);
    if (out_dtype == DType::kF32) {
      // fp32 out: bias broadcast, then the GEMM adds the products to it in fp32 (beta = 1).
      ZERO_RETURN_IF_ERROR(launch_kernel(device, "broadcast_widen_kernel", broadcast_widen_kernel<Bias>,
                                         blocks_for(n * oc), kThreads, static_cast<float*>(out), b, n, oc));
      return product(out, DType::kF32, 1.0f);
    }
    // Half out: cuBLASLt's epilogue where the bias has out's dtype and cuBLASLt has an algorithm; else the
    // products into an fp32 scratch, the bias added in fp32, one rounding into out.
    if (bias_dtype == out_dtype) {
      const absl::Status fused = gemm_bias_epilogue(device, out, out_dtype, inp, weight, bias, half, n, c, oc);
      if (!absl::IsNotFound(fused)) return fused;
    }
    return through_fp32_scratch(
        device, n * oc, [&](float* acc) { return product(acc, DType::kF32, 0.0f); },
        [&](const float* acc) {
          return with_type(out_dtype, [&](auto* out_tag) {
            using Out = Pointee<decltype(out_tag)>;
            return launch_kernel(device, "add_bias_narrow_kernel", add_bias_narrow_kernel<Out, Bias>,
                                 blocks_for(n * oc), kThreads, static_cast<Out*>(out), acc, b, n, oc);
          });
        });
  });
}

absl::Status matmul_backward_half(int device, void* dinp, DType dinp_dtype, void* dweight, DType dweight_dtype,
                                  void* dbias, DType dbias_dtype, const void* dout, const void* inp, const void* weight,
                                  DType half, int64_t n, int64_t c, int64_t oc) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return absl::OkStatus();
  if (dinp != nullptr) {
    // dinp (N, C) = dout (N, OC) · weight (OC, C)
    ZERO_RETURN_IF_ERROR(
        gemm_ex(device, CUBLAS_OP_N, CUBLAS_OP_N, c, n, oc, weight, c, dout, oc, half, 0.0f, dinp, dinp_dtype, c));
  }
  // dweight (OC, C) += dout^T (OC, N) · inp (N, C). An fp32 dweight takes the sum through beta = 1; a half one
  // gets it from an fp32 scratch, added in fp32 and rounded once: cuBLAS's own beta = 1 into a half C was seen
  // up to one ulp off that on an H200 (cuBLAS 13), rounding twice.
  const auto product = [&](void* dst, DType dst_dtype, float beta) {
    return gemm_ex(device, CUBLAS_OP_N, CUBLAS_OP_T, c, oc, n, inp, c, dout, oc, half, beta, dst, dst_dtype, c);
  };
  if (dweight_dtype == DType::kF32) {
    ZERO_RETURN_IF_ERROR(product(dweight, DType::kF32, 1.0f));
  } else {
    ZERO_RETURN_IF_ERROR(through_fp32_scratch(
        device, oc * c, [&](float* acc) { return product(acc, DType::kF32, 0.0f); },
        [&](const float* acc) {
          return with_type(dweight_dtype, [&](auto* out_tag) {
            using Out = Pointee<decltype(out_tag)>;
            return launch_kernel(device, "accumulate_narrow_kernel", accumulate_narrow_kernel<Out>, blocks_for(oc * c),
                                 kThreads, static_cast<Out*>(dweight), acc, oc * c);
          });
        }));
  }
  if (dbias == nullptr) return absl::OkStatus();
  return with_type(half, [&](auto* in_tag) {
    using In = Pointee<decltype(in_tag)>;
    return with_type(dbias_dtype, [&](auto* out_tag) {
      using Out = Pointee<decltype(out_tag)>;
      return add_column_sums(device, n, oc, static_cast<Out*>(dbias),
                             MatrixElement<In>{static_cast<const In*>(dout), oc});
    });
  });
}

}  // namespace zero::kernels::cuda
