// A half GEMM with its bias added in cuBLASLt's epilogue: host code (cuBLASLt needs no kernel of ours), beside
// matmul.cu, whose forward takes it where it can.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace zero::kernels::cuda {

// out (N, OC) = round(inp (N, C) · weight^T (C, OC) + bias (OC)), inp and weight in `half`, bias and out in
// `out_dtype`: cuBLASLt's bias epilogue adds the bias to the fp32 sums and rounds once into out; split-K partials stay
// fp32. On cuda:`device` (current), its current stream. NotFound, with nothing queued, where a pointer is not 16-byte
// aligned or cuBLASLt offers no algorithm for the shape: the caller takes the unfused path.
absl::Status gemm_bias_epilogue(int device, void* out, DType out_dtype, const void* inp, const void* weight,
                                const void* bias, DType half, int64_t n, int64_t c, int64_t oc);

}  // namespace zero::kernels::cuda
