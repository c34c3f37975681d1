// Fused softmax cross-entropy forward and backward on CUDA: one block per row, then one block sums the rows' losses
// and counts on the device, in a fixed order.
#include <cfloat>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

struct MaxAt {
  float value;
  int64_t index;
};

// The larger value; on ties the lower index, as the CPU's first-maximum scan.
__device__ MaxAt max_at(MaxAt a, MaxAt b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

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
// -log p(target), row_correct[r] = argmax == target. Ignored rows get a zero gradient and no loss. d may
// alias x: every element is read before the block's first barrier or by the thread that then writes it. d null:
// the loss alone (the sum adds the same floats).
__global__ void crossentropy_kernel(float* dlogits, const float* logits, const int32_t* targets, int64_t vocab,
                                    int64_t padded, float scale, double* row_loss, int32_t* row_correct) {
  __shared__ MaxAt max_shared[kThreads];
  __shared__ double sum_shared[kThreads];
  const int64_t r = blockIdx.x;
  const float* x = logits + r * padded;
  float* d = dlogits != nullptr ? dlogits + r * padded : nullptr;
  const int32_t target = targets[r];
  if (target == kIgnoreIndex) {
    for (int64_t v = threadIdx.x; d != nullptr && v < padded; v += kThreads) d[v] = 0.0f;
    if (threadIdx.x == 0) row_loss[r] = 0.0, row_correct[r] = 0;
    return;
  }
  const float target_logit = x[target];
  MaxAt local{-FLT_MAX, vocab};
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) local = max_at(local, MaxAt{x[v], v});
  const MaxAt best = block_reduce(local, max_shared, max_at);
  double sum = 0.0;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) {
    const float e = expf(x[v] - best.value);
    if (d != nullptr) d[v] = e;
    sum += e;
  }
  sum = block_reduce(sum, sum_shared, [](double a, double b) { return a + b; });
  const float inv = static_cast<float>(scale / sum);
  for (int64_t v = threadIdx.x; d != nullptr && v < vocab; v += kThreads) {
    d[v] = d[v] * inv - (v == target ? scale : 0.0f);
  }
  for (int64_t v = vocab + threadIdx.x; d != nullptr && v < padded; v += kThreads) d[v] = 0.0f;
  if (threadIdx.x == 0) {
    row_loss[r] = log(sum) - (static_cast<double>(target_logit) - best.value);
    row_correct[r] = best.index == target ? 1 : 0;
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

absl::Status crossentropy_forward_backward(int device, LossSums* sums, float* dlogits, const float* logits,
                                           const int32_t* targets, int64_t n, int64_t vocab, int64_t padded,
                                           float scale) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  if (n == 0) return zero_on_current_stream(device, sums, sizeof(LossSums));
  // row_loss (N) fp64, then row_correct (N) int32; freed in stream order, after the sums read the rows
  return with_scratch(device, n * (sizeof(double) + sizeof(int32_t)), [&](void* rows) {
    double* row_loss = static_cast<double*>(rows);
    int32_t* row_correct = reinterpret_cast<int32_t*>(row_loss + n);
    ZERO_RETURN_IF_ERROR(launch_kernel(device, "crossentropy_kernel", crossentropy_kernel, static_cast<unsigned>(n),
                                       kThreads, dlogits, logits, targets, vocab, padded, scale, row_loss,
                                       row_correct));
    return launch_kernel(device, "sum_rows_kernel", sum_rows_kernel, 1, kThreads, row_loss, row_correct, n, sums);
  });
}

}  // namespace zero::kernels::cuda
