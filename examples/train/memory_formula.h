// The ZeRO paper's per-rank model-state bytes (DESIGN.md's table), to check a budget and the measured peaks against.
#pragma once

#include <cstdint>

#include "runtime/dtype.h"

namespace zero::train {

// Per rank, for Ψ parameters over N ranks; p = 4 (fp32) or 2 (bf16/fp16) bytes per parameter and gradient,
// fp32 master weights only with bf16/fp16, k fp32 optimizer floats per parameter (Adam 2, SGD+momentum 1):
//   params p·Ψ (stage 3: p·Ψ/N), grads p·Ψ (stage 2-3: p·Ψ/N), master 4·Ψ and state 4k·Ψ (stage 1-3: /N).
// Ψ/N is rounded up, as the engine pads each unit to a multiple of N.
struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer_state = 0;
  int64_t master_weights = 0;

  int64_t total() const { return params + grads + optimizer_state + master_weights; }
};

ModelStateBytes zero_model_state_bytes(int stage, int64_t num_params, int world_size, DType precision,
                                       int optimizer_state_floats);

}  // namespace zero::train
