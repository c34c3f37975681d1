// Half GEMMs through cuBLASLt, where its epilogue adds a bias and a residual (its C matrix, apart from D) or applies
// GELU before the one rounding: host code (cuBLASLt needs no kernel of ours), beside matmul.cu, which takes them where
// it can.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace zero::kernels::cuda {

// What lt_gemm asks of every pointer, and tells the heuristic: 16 bytes, what its kernels' vector and TMA loads need.
// Pinned rather than read from the addresses, so the algorithm, and with it the bits, depend on the problem alone and
// not on where its buffers happen to lie (a gathered unit, a recomputed block).
inline constexpr uint32_t kLtAlignment = 16;

// One GEMM and its epilogue. Column-major, as cuBLAS sees row-major tensors (matmul.cu's gemm passes them swapped):
//   S (m, n) = op_a(A) (m, k) · op_b(B) (k, n) [+ bias (m): entry i added to all of S's row i] [+ C (m, n)]
//   D (m, n) = round(S), or with gelu_pre: D = round(GELU(S)) and gelu_pre (m, n) = round(S)
// A and B in `half`; D, C, the bias and gelu_pre in `d_dtype`, C and gelu_pre laid out as D. The products are
// summed in fp32 (split-K partials kept fp32), C and the bias added to the sum in fp32 in the epilogue (in the order
// cuBLASLt takes, which it does not document), GELU (tanh approximation) applied to the fp32 sum, and each matrix
// written rounded once.
struct LtGemm {
  bool transpose_a = false, transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;
  DType d_dtype = DType::kF32;
  int64_t ldd = 0;
  const void* bias = nullptr;      // null: none
  DType bias_dtype = DType::kF32;  // the epilogue takes d_dtype's only
  void* gelu_pre = nullptr;        // null: no GELU; else written, ld = ldd
  const void* c = nullptr;         // null: none; else a matrix apart from d (a residual)
};

// On cuda:`device` (current), its current stream. NotFound, with nothing queued, where a pointer is not 16-byte
// aligned, a bias is not in d_dtype, GELU's leading dimension is not a multiple of 8 (cuBLASLt's rule for it), or
// cuBLASLt offers no algorithm for the problem, among its heuristic's best 8, that keeps its sums in fp32, can write D
// apart from a C that lies apart, and passes cublasLtMatmulAlgoCheck, or refuses that algorithm at the call
// (remembered; cuBLASLt documents such a refusal as one of configuration, before any launch): the caller takes its
// unfused path. The last two are said once per problem on stderr.
absl::Status lt_gemm(int device, DType half, const LtGemm& g);

}  // namespace zero::kernels::cuda
