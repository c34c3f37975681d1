// CUDA launchers of the fused optimizer kernels: one kernel per optimizer over the flat fp32 shard.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "optim/element_math.h"
#include "optim/optimizer.h"

namespace zero::optim {

absl::Status cuda_zero(void* ptr, int64_t nbytes);

// Each updates the shard in place (fp32 master, state) and writes the half copy in the same pass when
// step.half is enabled. They run on the legacy default stream and return once the kernels have finished.
absl::Status sgd_cuda(const ShardLayout& layout, const std::vector<SgdCoeffs>& coeffs, const ShardStep& step,
                      float* momentum_buffer /*(S), null without momentum*/);
absl::Status adam_cuda(const ShardLayout& layout, const std::vector<AdamCoeffs>& coeffs, const ShardStep& step,
                       float* exp_avg /*(S)*/, float* exp_avg_sq /*(S)*/);

}  // namespace zero::optim
