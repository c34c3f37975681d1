// The CPU's path for a kernel in the training precision whose fp32 code works on whole fp32 buffers (GEMMs,
// attention): the fp32 kernel on widened copies, each result it writes rounded once.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <vector>

#include "absl/status/status.h"
#include "runtime/tensor.h"

namespace zero::kernels::detail {

// `fp32_call` on fp32 copies of `tensors` (each bf16/fp16 one widened exactly; fp32 and undefined ones as they are),
// then each half tensor among `written` (indices into `tensors`) gets its copy's values, rounded once to nearest even.
// CPU tensors only: the copies live on the host.
absl::Status on_widened(std::vector<Tensor> tensors, std::initializer_list<size_t> written,
                        const std::function<absl::Status(const std::vector<Tensor>&)>& fp32_call);

}  // namespace zero::kernels::detail
