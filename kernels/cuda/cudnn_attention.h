// cuDNN's fused flash attention for the CUDA attention kernels in bf16/fp16 (built with ZERO_HAS_CUDNN).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/dtype.h"

namespace zero::kernels::cuda {

// attention_forward/backward (cuda_kernels.h) through cudnn-frontend's scaled-dot-product-attention graphs: causal,
// scale 1/sqrt(HS), fp32 softmax and sums, q, k, v read in place from inp (B, T, 3C) and their gradients written in
// place into dinp, lse (B, NH, T) cuDNN's softmax statistics. `dtype` is bf16 or fp16. The graphs are built on a
// shape's first call on a thread (cuDNN handles are per thread) and kept; the backward asks cuDNN for its
// deterministic algorithm, so a run repeats its bits. Returns false, having queued nothing, where cuDNN refuses the
// shape or the GPU (the reason printed once per shape): the caller then runs the tiled kernels, for forward and
// backward alike. Any other cuDNN failure (a library that does not load, a graph it cannot run) is an error naming
// ZERO_CUDNN_ATTENTION=0, which avoids cuDNN. The workspace is stream-ordered scratch outside the allocator's
// categories, as the other kernels' is; the deterministic backward's grows as B·NH·T² (192 MiB at B 8, NH 12, T 1024
// on Hopper).
absl::StatusOr<bool> cudnn_attention_forward(int device, void* out, float* lse, const void* inp, DType dtype, int64_t b,
                                             int64_t t, int64_t nh, int64_t hs);
absl::StatusOr<bool> cudnn_attention_backward(int device, void* dinp, const void* dout, const void* inp,
                                              const void* out, const float* lse, DType dtype, int64_t b, int64_t t,
                                              int64_t nh, int64_t hs);

}  // namespace zero::kernels::cuda
