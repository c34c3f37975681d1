// CUDA launchers of the fused optimizer kernels: one kernel per optimizer over the flat fp32 shard.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "optim/element_math.h"
#include "optim/optimizer.h"
#include "optim/square_sum.h"

namespace zero::optim {

// Each runs on cuda:`device`, whichever device the calling thread has current.
absl::Status cuda_zero(int device, void* ptr, int64_t nbytes);

// Each updates the shard in place (fp32 master, state) and writes the half copy in the same pass when
// step.half is enabled. They queue their kernels on the current stream (runtime/device_api.h) and return without
// waiting for them: work queued there next sees the update.
absl::Status sgd_cuda(int device, const ShardLayout& layout, const std::vector<SgdCoeffs>& coeffs,
                      const ShardStep& step, float* momentum_buffer /*(S), null without momentum*/);
absl::Status adam_cuda(int device, const ShardLayout& layout, const std::vector<AdamCoeffs>& coeffs,
                       const ShardStep& step, float* exp_avg /*(S)*/, float* exp_avg_sq /*(S)*/);

// LAMB and LARS: pass 1 fills exact square bins (square_sum.h) of two quantities per chunk of the layout on
// the device and queues their copy into `bins.host`; its reader waits for that copy and turns them into SquareSums,
// the same integers the CPU bins hold. After the caller's allreduce,
// pass 2 applies each parameter's scale (`param_scale`, one per layout parameter).
// `bins` (allocate_square_bins): kSquareSlots uint64 counters per quantity per chunk, on the device and pinned.
int64_t square_bins_bytes(const ShardLayout& layout);

// Updates the moments; sums ||p||^2 and ||u||^2 (u = lamb_direction).
absl::StatusOr<ChunkSumsReader> lamb_sums_cuda(int device, const ShardLayout& layout,
                                               const std::vector<LambCoeffs>& coeffs, const ShardStep& step,
                                               float* exp_avg, float* exp_avg_sq, const SquareBinsScratch& bins);
// p += param_scale * u, with param_scale = -lr * trust_ratio.
absl::Status lamb_apply_cuda(int device, const ShardLayout& layout, const std::vector<LambCoeffs>& coeffs,
                             const std::vector<float>& param_scale, const ShardStep& step, const float* exp_avg,
                             const float* exp_avg_sq);

// Sums ||p||^2 and ||g||^2.
absl::StatusOr<ChunkSumsReader> lars_sums_cuda(int device, const ShardLayout& layout,
                                               const std::vector<LarsCoeffs>& coeffs, const ShardStep& step,
                                               const SquareBinsScratch& bins);
// lars_element with scaled_lr = param_scale.
absl::Status lars_apply_cuda(int device, const ShardLayout& layout, const std::vector<LarsCoeffs>& coeffs,
                             const std::vector<float>& param_scale, const ShardStep& step, float* momentum_buffer);

// exact_square_sum (square_sum.h) of the floating tensors `xs` on `device`: one block bins each kMaxBinnedValues
// chunk of each tensor, and the bins of up to `chunks_per_read` chunks come back together (by default 8 MiB of
// bins, scratch from the device's pool, so a rank's slice of up to 2^28 elements costs one read) to be summed as
// the CPU sums its chunks. Waits for the result.
inline constexpr int64_t kSquareChunksPerRead = 4096;
absl::StatusOr<SquareSum> exact_square_sum_cuda(int device, std::span<const Tensor> xs, float divisor,
                                                int64_t chunks_per_read = kSquareChunksPerRead);

}  // namespace zero::optim
