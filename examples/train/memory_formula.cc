#include "examples/train/memory_formula.h"

namespace zero::train {

ModelStateBytes zero_model_state_bytes(int stage, int64_t num_params, int world_size, DType precision,
                                       int optimizer_state_floats) {
  const int64_t p = static_cast<int64_t>(dtype_size(precision));
  const int64_t whole = num_params;
  const int64_t slice = (num_params + world_size - 1) / world_size;
  return {
      .params = p * (stage == 3 ? slice : whole),
      .grads = p * (stage >= 2 ? slice : whole),
      .optimizer_state = 4 * optimizer_state_floats * (stage >= 1 ? slice : whole),
      .master_weights = precision == DType::kF32 ? 0 : 4 * (stage >= 1 ? slice : whole),
  };
}

}  // namespace zero::train
