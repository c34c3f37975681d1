// Softmax cross-entropy over a padded vocab with ignored targets, its gradient and argmax accuracy in one pass, in
// fp32, bf16 or fp16.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/fast_math.h"
#include "kernels/kernels.h"
#include "runtime/device_memory.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/parallel.h"
#include "runtime/sim/sim_api.h"
#include "runtime/status.h"

namespace zero::kernels {
namespace {

constexpr int64_t kRowBlock = 8;

struct RowSums {
  double loss = 0;
  int64_t correct = 0;
  RowSums& operator+=(const RowSums& o) {
    loss += o.loss;
    correct += o.correct;
    return *this;
  }
};

// The left fold of std::max over x[0, n) (a NaN after x[0] is skipped; a NaN x[0] stays), in 8 lanes that vectorize:
// the same value as the fold (max is exact), ±0 aside.
ZERO_VECTOR_CLONES float max_of(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, x[0]);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    // std::max(lanes[k], x) written as a select, kept a loop: it if-converts into a vector max (std::max does not).
#pragma omp simd
    for (int k = 0; k < kLanes; ++k) lanes[k] = x[i + k] > lanes[k] ? x[i + k] : lanes[k];
  }
  for (; i < n; ++i) lanes[0] = std::max(lanes[0], x[i]);
  for (int k = 1; k < kLanes; ++k) lanes[0] = std::max(lanes[0], lanes[k]);
  return lanes[0];
}

// The first column in [0, n) holding `value`, or n if none: 64 columns at a time by a vectorized compare, then
// a scan of the chunk that hit.
ZERO_VECTOR_CLONES int64_t first_equal(const float* x, int64_t n, float value) {
  constexpr int64_t kChunk = 64;
  int64_t begin = 0;
  for (; begin + kChunk <= n; begin += kChunk) {
    int hits = 0;
#pragma omp simd reduction(+ : hits)
    for (int64_t v = begin; v < begin + kChunk; ++v) hits += x[v] == value ? 1 : 0;
    if (hits > 0) break;
  }
  while (begin < n && !(x[begin] == value)) ++begin;
  return begin;
}

// One row: writes dlogits = scale * (softmax - onehot(target)) over [0, vocab) and 0 over the padding;
// returns the row's -log p(target) and whether the argmax is the target. x and d may alias.
ZERO_VECTOR_CLONES RowSums row_forward_backward(const float* x, float* d, int64_t vocab, int64_t padded, int32_t target,
                                                float scale) {
  // The largest logit, then the first column holding it (a NaN x[0]: column 0).
  const float max = max_of(x, vocab);
  int64_t argmax = first_equal(x, vocab, max);
  if (argmax == vocab) argmax = 0;
  const float target_logit = x[target];
  // The exps and the sum vectorize.
#pragma omp simd  // d may be x itself: each element is read before it is written
  for (int64_t v = 0; v < vocab; ++v) d[v] = detail::exp_poly(x[v] - max);
  const double sum = detail::sum_fp64(d, vocab);
  const float inv = static_cast<float>(scale / sum);
  for (int64_t v = 0; v < vocab; ++v) d[v] *= inv;
  d[target] -= scale;
  std::fill(d + vocab, d + padded, 0.0f);
  return {std::log(sum) - (static_cast<double>(target_logit) - max), argmax == target ? 1 : 0};
}

constexpr absl::string_view kOp = "crossentropy_forward_backward";

// The arguments' dtypes, shapes and devices, the sums' alignment, and vocab within the logits' padded width.
absl::Status check_args(const Tensor& sums, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                        int64_t vocab) {
  const int64_t n = detail::num_rows(logits), padded = detail::last_dim(logits);
  const Device dev = logits.device();
  ZERO_RETURN_IF_ERROR(detail::check_floating(kOp, "logits", logits));
  if (dlogits.data() != nullptr) {
    ZERO_RETURN_IF_ERROR(detail::check_matrix(kOp, "dlogits", dlogits, logits.dtype(), dev, n, padded));
  }
  ZERO_RETURN_IF_ERROR(detail::check_numel(kOp, "targets", targets, DType::kI32, dev, n));
  ZERO_RETURN_IF_ERROR(detail::check_numel(kOp, "sums", sums, DType::kU8, dev, sizeof(LossSums)));
  if (reinterpret_cast<uintptr_t>(sums.data()) % alignof(LossSums) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": sums at 0x",
                                                   absl::Hex(reinterpret_cast<uintptr_t>(sums.data())), " must be ",
                                                   alignof(LossSums), "-byte aligned"));
  }
  ZERO_RETURN_IF_ERROR(detail::check_backend(kOp, dev));
  if (vocab < 1 || vocab > padded) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": vocab ", vocab, " outside [1, ", padded, "] (logits' last dim)"));
  }
  return absl::OkStatus();
}

// How many of the n targets count (are not kIgnoreIndex); InvalidArgument naming the first outside [0, vocab).
absl::StatusOr<int64_t> counted_targets(const int32_t* targets, int64_t n, int64_t vocab) {
  int64_t counted = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (targets[r] == kIgnoreIndex) continue;
    if (targets[r] < 0 || targets[r] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": target ", targets[r], " at ", r, " outside [0, ", vocab, ") and not ", kIgnoreIndex));
    }
    ++counted;
  }
  return counted;
}

// The rows on the CPU, blocks of kRowBlock in parallel and their sums added in order; dlogits written where it is
// not null. A bf16/fp16 row is widened into `row` and computed there in fp32, its gradient rounded once into dlogits;
// an fp32 row is computed in place, `row` holding its gradient only where none is asked for (computed, dropped).
RowSums cpu_rows(const Tensor& dlogits, const Tensor& logits, const int32_t* targets, int64_t vocab, float scale) {
  const int64_t n = detail::num_rows(logits), padded = detail::last_dim(logits);
  const bool gradient = dlogits.data() != nullptr;
  return visit_floating(logits.dtype(), [&](auto type) {
    constexpr DType T = decltype(type)::value;
    return ordered_block_sum<RowSums>(n, kRowBlock, [&](int64_t r0, int64_t r1) {
      RowSums s;
      std::vector<float> row(T == DType::kF32 && gradient ? 0 : padded);
      for (int64_t r = r0; r < r1; ++r) {
        const float* x = row.data();
        float* d = row.data();
        if constexpr (T == DType::kF32) {
          x = logits.data_as<float>() + r * padded;
          if (gradient) d = dlogits.data_as<float>() + r * padded;
        } else {
          for (int64_t v = 0; v < padded; ++v) row[v] = load_as_float(logits.data(), T, r * padded + v);
        }
        if (targets[r] == kIgnoreIndex) {
          std::fill(d, d + padded, 0.0f);
        } else {
          s += row_forward_backward(x, d, vocab, padded, targets[r], scale);
        }
        if (T != DType::kF32 && gradient) {
          for (int64_t v = 0; v < padded; ++v) store_from_float(dlogits.data(), T, r * padded + v, row[v]);
        }
      }
      return s;
    });
  });
}

}  // namespace

CrossEntropyResult loss_of(const LossSums& sums, int64_t counted) {
  const float loss = counted > 0 ? static_cast<float>(sums.loss / static_cast<double>(counted)) : 0.0f;
  return {loss, counted, sums.correct};
}

absl::StatusOr<int64_t> crossentropy_forward_backward_into(const Tensor& sums, const Tensor& dlogits,
                                                           const Tensor& logits, const Tensor& targets, int64_t vocab,
                                                           const Tensor& host_targets, float loss_scale) {
  ZERO_RETURN_IF_ERROR(check_args(sums, dlogits, logits, targets, vocab));
  std::vector<int32_t> host_copy;
  ZERO_ASSIGN_OR_RETURN(const int32_t* tgt, int32_on_host(targets, host_targets, host_copy));
  const int64_t n = detail::num_rows(logits);
  ZERO_ASSIGN_OR_RETURN(const int64_t counted, counted_targets(tgt, n, vocab));
  const Device dev = logits.device();
  const bool gradient = dlogits.data() != nullptr;  // else the loss alone, with the same bits
  if (dev.is_sim()) {  // the targets were checked on the host above, as for CUDA; the sums stay on the device
    std::vector<Access> accesses = {reads(logits), reads(targets), writes(sums)};
    if (gradient) accesses.push_back(writes(dlogits));
    ZERO_RETURN_IF_ERROR(launch_on_sim(
        dev, "crossentropy_forward_backward", std::move(accesses), [=](HostTensors& host) -> absl::Status {
          const Tensor d = gradient ? host(dlogits) : Tensor();
          return crossentropy_forward_backward_into(host(sums), d, host(logits), host(targets), vocab, Tensor(),
                                                    loss_scale)
              .status();
        }));
    return counted;
  }
  const float scale = counted > 0 ? loss_scale / static_cast<float>(counted) : 0.0f;
#if ZERO_HAS_CUDA
  if (dev.is_cuda()) {
    ZERO_RETURN_IF_ERROR(cuda::crossentropy_forward_backward(
        dev.index, static_cast<LossSums*>(sums.data()), dlogits.data(), logits.data(), logits.dtype(),
        targets.data_as<int32_t>(), n, vocab, detail::last_dim(logits), scale));
    return counted;
  }
#endif
  const RowSums row_sums = cpu_rows(dlogits, logits, tgt, vocab, scale);
  *static_cast<LossSums*>(sums.data()) = LossSums{row_sums.loss, row_sums.correct};
  return counted;
}

// The sums land in a slot of the logits' device and are copied back: on a device the host waits for them.
absl::StatusOr<CrossEntropyResult> crossentropy_forward_backward(const Tensor& dlogits, const Tensor& logits,
                                                                 const Tensor& targets, int64_t vocab,
                                                                 const Tensor& host_targets, float loss_scale) {
  const Device dev = logits.device();
  ZERO_ASSIGN_OR_RETURN(void* slot, device_alloc(dev, sizeof(LossSums)));
  absl::StatusOr<int64_t> counted = crossentropy_forward_backward_into(
      Tensor(slot, DType::kU8, {sizeof(LossSums)}, dev), dlogits, logits, targets, vocab, host_targets, loss_scale);
  LossSums sums;
  absl::Status copied = counted.status();
  if (copied.ok()) copied = copy_bytes(&sums, Device::cpu(), slot, dev, sizeof(LossSums));
  device_free(dev, slot);
  ZERO_RETURN_IF_ERROR(copied);
  return loss_of(sums, *counted);
}

}  // namespace zero::kernels
