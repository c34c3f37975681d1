// Token + position embedding on CUDA: a gather forward; a deterministic backward that gives each token's rows to one
// block.
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/pinned_uploads.h"

namespace zero::kernels::cuda {
namespace {

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                         int64_t bt, int64_t t, int64_t c) {
  ZERO_GRID_STRIDE(i, bt * c) {
    const int64_t row = i / c, col = i % c;
    out[i] = wte[tokens[row] * c + col] + wpe[(row % t) * c + col];
  }
}

// Rows grouped by token (a stable counting sort on the host): the rows of unique token u, in increasing
// order, are rows[offsets[u] .. offsets[u + 1]).
struct TokenRows {
  std::vector<int32_t> packed;  // offsets (U + 1), then tokens (U), then rows (B·T)
  int64_t unique = 0;
};

TokenRows group_rows_by_token(const int32_t* tokens, int64_t bt, int64_t vocab) {
  std::vector<int32_t> count(static_cast<size_t>(vocab) + 1, 0);
  for (int64_t r = 0; r < bt; ++r) ++count[tokens[r] + 1];
  for (int64_t v = 0; v < vocab; ++v) count[v + 1] += count[v];  // count[v]: first slot of token v
  std::vector<int32_t> rows(static_cast<size_t>(bt));
  std::vector<int32_t> next(count.begin(), count.end() - 1);
  for (int64_t r = 0; r < bt; ++r) rows[next[tokens[r]]++] = static_cast<int32_t>(r);
  TokenRows g;
  std::vector<int32_t> offsets, unique;
  for (int64_t v = 0; v < vocab; ++v) {
    if (count[v + 1] == count[v]) continue;
    offsets.push_back(count[v]);
    unique.push_back(static_cast<int32_t>(v));
  }
  offsets.push_back(static_cast<int32_t>(bt));
  g.unique = static_cast<int64_t>(unique.size());
  g.packed = offsets;
  g.packed.insert(g.packed.end(), unique.begin(), unique.end());
  g.packed.insert(g.packed.end(), rows.begin(), rows.end());
  return g;
}

// Block u owns token tokens[u]'s row of dwte and adds that token's dout rows in increasing row order: the
// CPU's order, so the same bits, with no atomics.
__global__ void embedding_backward_wte_kernel(float* dwte, const float* dout, const int32_t* offsets,
                                              const int32_t* tokens, const int32_t* rows, int64_t c) {
  const int64_t u = blockIdx.x;
  float* te = dwte + tokens[u] * c;
  for (int64_t col = threadIdx.x; col < c; col += blockDim.x) {
    float acc = te[col];
    for (int32_t k = offsets[u]; k < offsets[u + 1]; ++k) acc += dout[rows[k] * c + col];
    te[col] = acc;
  }
}

// dwpe[t] += sum over b of dout[b, t], b in increasing order.
__global__ void embedding_backward_wpe_kernel(float* dwpe, const float* dout, int64_t b, int64_t t, int64_t c) {
  ZERO_GRID_STRIDE(i, t * c) {
    float acc = dwpe[i];
    for (int64_t k = 0; k < b; ++k) acc += dout[k * t * c + i];
    dwpe[i] = acc;
  }
}

}  // namespace

absl::Status embedding_forward(int device, float* out, const int32_t* tokens, const float* wte, const float* wpe,
                               int64_t b, int64_t t, int64_t c) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (b * t * c == 0) return absl::OkStatus();
  return launch_kernel(device, "embedding_forward_kernel", embedding_forward_kernel, blocks_for(b * t * c), kThreads,
                       out, tokens, wte, wpe, b * t, t, c);
}

absl::Status embedding_backward(int device, float* dwte, float* dwpe, const float* dout, const int32_t* host_tokens,
                                int64_t b, int64_t t, int64_t c, int64_t vocab) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (b * t * c == 0) return absl::OkStatus();
  const TokenRows g = group_rows_by_token(host_tokens, b * t, vocab);
  const size_t bytes = g.packed.size() * sizeof(int32_t);
  return with_scratch(device, bytes, [&](void* packed) {
    // Staged through pinned memory, so g may go out of scope and the host does not wait; ordered on the current
    // stream like the kernels.
    ZERO_RETURN_IF_ERROR(
        pinned_uploads(Device::cuda(device))->upload(packed, g.packed.data(), bytes, current_cuda_stream(device)));
    const int32_t* offsets = static_cast<const int32_t*>(packed);
    const int32_t* tokens = offsets + g.unique + 1;
    ZERO_RETURN_IF_ERROR(launch_kernel(device, "embedding_backward_wte_kernel", embedding_backward_wte_kernel,
                                       static_cast<unsigned>(g.unique), kThreads, dwte, dout, offsets, tokens,
                                       tokens + g.unique, c));
    return launch_kernel(device, "embedding_backward_wpe_kernel", embedding_backward_wpe_kernel, blocks_for(t * c),
                         kThreads, dwpe, dout, b, t, c);
  });
}

}  // namespace zero::kernels::cuda
