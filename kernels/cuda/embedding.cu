// Token + position embedding on CUDA in fp32, bf16 or fp16: a gather forward; a backward that sorts rows by token
// (CUB), a block per token.
#include <cub/device/device_radix_sort.cuh>

#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/cuda/half.cuh"
#include "runtime/dtype_dispatch.h"

namespace zero::kernels::cuda {
namespace {

template <DType T>
__global__ void embedding_forward_kernel(void* out, const int32_t* tokens, const void* wte, const void* wpe, int64_t bt,
                                         int64_t t, int64_t c) {
  ZERO_GRID_STRIDE(i, bt * c) {
    const int64_t row = i / c, col = i % c;
    store_float<T>(out, i, load_float<T>(wte, tokens[row] * c + col) + load_float<T>(wpe, (row % t) * c + col));
  }
}

// rows[i] = i.
__global__ void iota_kernel(int32_t* rows, int64_t n) { ZERO_GRID_STRIDE(i, n) rows[i] = static_cast<int32_t>(i); }

// dwte (V, C), dout (B·T, C); sorted_tokens, sorted_rows (B·T): the rows sorted by token, stably (CUB's radix
// sort), so each token's rows are a run in increasing row order. Block k owns the run that starts at k, if one does,
// and adds its dout rows into the token's row of dwte in that order, in fp32, rounding once: the CPU's order, so the
// same bits, with no atomics.
template <DType T>
__global__ void embedding_backward_wte_kernel(void* dwte, const void* dout, const uint32_t* sorted_tokens,
                                              const int32_t* sorted_rows, int64_t bt, int64_t c) {
  const int64_t k = blockIdx.x;
  const uint32_t token = sorted_tokens[k];
  if (k > 0 && sorted_tokens[k - 1] == token) return;  // the whole block: not a run's start
  __shared__ int64_t end;                              // the run's, found once for the block
  if (threadIdx.x == 0) {
    end = k + 1;
    while (end < bt && sorted_tokens[end] == token) ++end;
  }
  __syncthreads();
  const int64_t te = static_cast<int64_t>(token) * c;
  for (int64_t col = threadIdx.x; col < c; col += blockDim.x) {
    float acc = load_float<T>(dwte, te + col);
    for (int64_t j = k; j < end; ++j) acc += load_float<T>(dout, sorted_rows[j] * c + col);
    store_float<T>(dwte, te + col, acc);
  }
}

// Bytes of a scratch block holding `count` values of T, rounded up so the next one stays aligned for CUB.
constexpr size_t kCubAlignment = 256;
template <typename T>
size_t aligned_bytes(int64_t count) {
  return (static_cast<size_t>(count) * sizeof(T) + kCubAlignment - 1) / kCubAlignment * kCubAlignment;
}

// Sorts the rows [0, bt) by their tokens (< 2^bits), stably, into sorted_tokens and sorted_rows, with CUB on the
// current stream; `temp` holds temp_bytes of CUB's scratch (temp null: only sets temp_bytes). A CUB error is a CUDA
// error, kept as the device's failure by the launch that queues the sort (unlike cuBLAS's, in matmul.cu).
absl::Status sort_rows_by_token(void* temp, size_t& temp_bytes, const uint32_t* tokens, uint32_t* sorted_tokens,
                                const int32_t* rows, int32_t* sorted_rows, int64_t bt, int bits, cudaStream_t stream) {
  return cuda_status(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, sorted_tokens, rows, sorted_rows,
                                                     static_cast<int>(bt), 0, bits, stream),
                     "cub::DeviceRadixSort::SortPairs");
}

// dwpe[t] += sum over b of dout[b, t], b in increasing order, in fp32, rounded once.
template <DType T>
__global__ void embedding_backward_wpe_kernel(void* dwpe, const void* dout, int64_t b, int64_t t, int64_t c) {
  ZERO_GRID_STRIDE(i, t * c) {
    float acc = load_float<T>(dwpe, i);
    for (int64_t k = 0; k < b; ++k) acc += load_float<T>(dout, k * t * c + i);
    store_float<T>(dwpe, i, acc);
  }
}

}  // namespace

absl::Status embedding_forward(int device, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                               DType dtype, int64_t b, int64_t t, int64_t c) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (b * t * c == 0) return absl::OkStatus();
  return visit_floating(dtype, [&](auto type) {
    return launch_kernel(device, "embedding_forward_kernel", embedding_forward_kernel<decltype(type)::value>,
                         blocks_for(b * t * c), kThreads, out, tokens, wte, wpe, b * t, t, c);
  });
}

absl::Status embedding_backward(int device, void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                                DType dtype, int64_t b, int64_t t, int64_t c, int64_t vocab) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (b * t * c == 0) return absl::OkStatus();
  const int64_t bt = b * t;
  if (bt > std::numeric_limits<int32_t>::max()) {  // CUB's count, the row ids and the grid are 32-bit
    return absl::InvalidArgumentError(absl::StrCat("embedding_backward on CUDA: ", bt, " rows (B·T) exceed 2^31 - 1"));
  }
  int bits = 1;  // enough for every token below vocab (checked on the host before)
  while (bits < 32 && (int64_t{1} << bits) < vocab) ++bits;
  // Tokens lie in [0, vocab): as unsigned keys they sort alike.
  const auto* keys = reinterpret_cast<const uint32_t*>(tokens);
  size_t temp_bytes = 0;
  ZERO_RETURN_IF_ERROR(sort_rows_by_token(nullptr, temp_bytes, keys, nullptr, nullptr, nullptr, bt, bits, nullptr));
  const size_t key_bytes = aligned_bytes<uint32_t>(bt), row_bytes = aligned_bytes<int32_t>(bt);
  return with_scratch(device, key_bytes + 2 * row_bytes + temp_bytes, [&](void* scratch) {
    auto* sorted_tokens = static_cast<uint32_t*>(scratch);
    auto* rows = reinterpret_cast<int32_t*>(static_cast<char*>(scratch) + key_bytes);
    auto* sorted_rows = reinterpret_cast<int32_t*>(static_cast<char*>(scratch) + key_bytes + row_bytes);
    void* temp = static_cast<char*>(scratch) + key_bytes + 2 * row_bytes;
    ZERO_RETURN_IF_ERROR(launch_kernel(device, "iota_kernel", iota_kernel, blocks_for(bt), kThreads, rows, bt));
    ZERO_RETURN_IF_ERROR(launch_on_stream(current_cuda_stream(device), "sort_rows_by_token", [&](cudaStream_t s) {
      return sort_rows_by_token(temp, temp_bytes, keys, sorted_tokens, rows, sorted_rows, bt, bits, s);
    }));
    return visit_floating(dtype, [&](auto type) -> absl::Status {
      constexpr DType T = decltype(type)::value;
      ZERO_RETURN_IF_ERROR(launch_kernel(device, "embedding_backward_wte_kernel", embedding_backward_wte_kernel<T>,
                                         static_cast<unsigned>(bt), kThreads, dwte, dout, sorted_tokens, sorted_rows,
                                         bt, c));
      return launch_kernel(device, "embedding_backward_wpe_kernel", embedding_backward_wpe_kernel<T>, blocks_for(t * c),
                           kThreads, dwpe, dout, b, t, c);
    });
  });
}

}  // namespace zero::kernels::cuda
