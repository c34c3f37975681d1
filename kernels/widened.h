// The CPU's path for a kernel in the training precision whose fp32 code works on whole fp32 buffers (GEMMs,
// attention): the fp32 kernel on widened copies, each result it writes rounded once.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "runtime/tensor.h"

namespace zero::kernels::detail {

// What the kernel does with an argument: reads it, writes all of it, or reads and writes it (a += result).
enum class Role { kIn, kOut, kInOut };

// `fp32_call` on fp32 stand-ins for `args`' tensors, in order: fp32 and undefined tensors as they are; each bf16/fp16
// one as an fp32 copy, widened exactly unless the kernel only writes it. Then each half tensor the kernel writes gets
// its copy's values, rounded once to nearest even. CPU tensors only: the copies live on the host.
absl::Status on_widened(const std::vector<std::pair<Tensor, Role>>& args,
                        const std::function<absl::Status(const std::vector<Tensor>&)>& fp32_call);

}  // namespace zero::kernels::detail
