// Fused softmax cross-entropy forward and backward on CUDA, logits in fp32, bf16 or fp16: one block per row, then one
// block sums the rows' losses and counts on the device, in a fixed order.
#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/max_at.h"
#include "runtime/cuda/half.cuh"
#include "runtime/dtype_dispatch.h"

namespace zero::kernels::cuda {
namespace {

// A fixed-shape tree over the block's kThreads partials: the same order on every run. Ends synchronized.
template <typename T, typename Combine>
__device__ T block_reduce(T x, T* shared, Combine combine) {
  shared[threadIdx.x] = x;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] = combine(shared[threadIdx.x], shared[threadIdx.x + half]);
    __syncthreads();
  }
  const T result = shared[0];
  __syncthreads();
  return result;
}

// Row r: d = scale * (softmax(x) - onehot(target)) over [0, vocab), 0 over the padding; row_loss[r] =
// -log p(target), row_correct[r] = argmax == target (the CPU's argmax, NaNs and infinities included). Ignored rows get
// a zero gradient and no loss. Thread t owns the row's chunks t, t + kThreads, ... (common.cuh), in every dtype the
// same. Two reads of the row: the first finds its max and sum of exps together (online softmax, Milakov & Gimelshein
// 2018: a thread's sum is rescaled in fp64 when its max grows, then the threads' sums are rescaled to the row's max and
// added in a fixed tree); the second writes d, each element rounded once to T, the exp computed again against the row's
// max, so d may alias x (the thread that writes a chunk has read it last, after the block's barriers). d null: the loss
// alone. (A row staged in shared memory, so that global memory saw it read once, took 1.44 ms on an H200 for GPT-2's
// 8192 rows of 50 304 bf16 logits: with two blocks an SM holding their rows, too few loads were in flight.)
template <DType T>
__global__ void crossentropy_kernel(void* dlogits, const void* logits, const int32_t* targets, int64_t vocab,
                                    int64_t padded, float scale, double* row_loss, int32_t* row_correct) {
  __shared__ MaxAt max_shared[kThreads];
  __shared__ double sum_shared[kThreads];
  const int64_t r = blockIdx.x, first = r * padded;
  const int64_t start = int64_t{threadIdx.x} * kChunk, stride = int64_t{kThreads} * kChunk;
  const int32_t target = targets[r];
  if (target == kIgnoreIndex) {
    for (int64_t v = start; dlogits != nullptr && v < padded; v += stride) {
      store_chunk<T>(dlogits, first + v, chunk_count(v, padded), Chunk{});
    }
    if (threadIdx.x == 0) row_loss[r] = 0.0, row_correct[r] = 0;
    return;
  }
  // Read before any thread writes d, which may alias the logits.
  const float target_logit = load_float<T>(logits, first + target), first_logit = load_float<T>(logits, first);
  const void* row = static_cast<const DeviceElement<T>*>(logits) + first;  // x[v] is row[v]
  MaxAt local{-FLT_MAX, vocab};
  double local_sum = 0.0;  // of exp(x - local.value) over this thread's elements
  for (int64_t v = start; v < vocab; v += stride) {
    const int64_t count = chunk_count(v, vocab);
    const Chunk x = load_chunk<T>(row, v, count);
    const float before = local.value;
    local = max_at_chunk(local, x.x, v, count);
    if (local.value > before) local_sum *= exp(static_cast<double>(before) - local.value);
    for (int e = 0; e < kChunk; ++e) {
      if (e < count) local_sum += expf(x.x[e] - local.value);
    }
  }
  const MaxAt best = block_reduce(local, max_shared, max_at);
  const double sum = block_reduce(local_sum * exp(static_cast<double>(local.value) - best.value), sum_shared,
                                  [](double a, double b) { return a + b; });
  const float inv = static_cast<float>(scale / sum);
  for (int64_t v = start; dlogits != nullptr && v < padded; v += stride) {
    Chunk x = load_chunk<T>(row, v, chunk_count(v, padded));
    for (int e = 0; e < kChunk; ++e) {
      const int64_t col = v + e;
      x.x[e] = col < vocab ? expf(x.x[e] - best.value) * inv - (col == target ? scale : 0.0f) : 0.0f;
    }
    store_chunk<T>(dlogits, first + v, chunk_count(v, padded), x);
  }
  if (threadIdx.x == 0) {
    row_loss[r] = log(sum) - (static_cast<double>(target_logit) - best.value);
    row_correct[r] = argmax_as_cpu(best, first_logit, vocab) == target ? 1 : 0;
  }
}

// sums = the rows' losses and correct counts summed: thread i over rows [i n / kThreads, (i + 1) n / kThreads) in
// order, then the fixed tree of block_reduce, so the same bits on every run.
__global__ void sum_rows_kernel(const double* row_loss, const int32_t* row_correct, int64_t n, LossSums* sums) {
  __shared__ double loss_shared[kThreads];
  __shared__ int64_t correct_shared[kThreads];
  double loss = 0.0;
  int64_t correct = 0;
  for (int64_t r = n * threadIdx.x / kThreads; r < n * (threadIdx.x + 1) / kThreads; ++r) {
    loss += row_loss[r];
    correct += row_correct[r];
  }
  loss = block_reduce(loss, loss_shared, [](double a, double b) { return a + b; });
  correct = block_reduce(correct, correct_shared, [](int64_t a, int64_t b) { return a + b; });
  if (threadIdx.x == 0) *sums = LossSums{loss, correct};
}

}  // namespace

absl::Status crossentropy_forward_backward(int device, LossSums* sums, void* dlogits, const void* logits, DType dtype,
                                           const int32_t* targets, int64_t n, int64_t vocab, int64_t padded,
                                           float scale) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return zero_on_current_stream(device, sums, sizeof(LossSums));
  // row_loss (N) fp64, then row_correct (N) int32; freed in stream order, after the sums read the rows
  return with_scratch(device, n * (sizeof(double) + sizeof(int32_t)), [&](void* rows) {
    double* row_loss = static_cast<double*>(rows);
    int32_t* row_correct = reinterpret_cast<int32_t*>(row_loss + n);
    ZERO_RETURN_IF_ERROR(visit_floating(dtype, [&](auto type) {
      return launch_kernel(device, "crossentropy_kernel", crossentropy_kernel<decltype(type)::value>,
                           static_cast<unsigned>(n), kThreads, dlogits, logits, targets, vocab, padded, scale, row_loss,
                           row_correct);
    }));
    return launch_kernel(device, "sum_rows_kernel", sum_rows_kernel, 1, kThreads, row_loss, row_correct, n, sums);
  });
}

}  // namespace zero::kernels::cuda
