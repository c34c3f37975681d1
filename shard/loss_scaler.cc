// LossScaler: DeepSpeed's dynamic fp16 loss scale, step by step.
#include "shard/loss_scaler.h"

#include <algorithm>

namespace zero {

LossScaler::LossScaler(DType precision, const LossScaling& config) : config_(config), fp16_(precision == DType::kF16) {
  if (!fp16_) return;
  state_.scale = config.static_scale > 0 ? config.static_scale : config.initial_scale;
  state_.hysteresis_left = config.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!fp16_ || config_.static_scale > 0) return;
  if (overflow) {
    state_.good_steps = 0;
    if (state_.hysteresis_left <= 1) {
      state_.scale = std::max(config_.min_scale, state_.scale / 2);
    } else {
      --state_.hysteresis_left;
    }
    return;
  }
  if (++state_.good_steps >= config_.window) {
    state_.scale *= 2;
    state_.good_steps = 0;
    state_.hysteresis_left = config_.hysteresis;
  }
}

}  // namespace zero
