// fp16 dynamic loss scaling, as DeepSpeed's DynamicLossScaler (ZeroConfig::loss_scaling).
#pragma once

#include "runtime/dtype.h"
#include "shard/config.h"

namespace zero {

// The scale the loss gradient is multiplied by. Only fp16 scales: bf16 and fp32 keep 1. Hysteresis
// delays only the first halving after a start or a scale-up; `window` good steps in a row double it.
class LossScaler {
 public:
  // What a checkpoint carries to resume the scaler exactly.
  struct State {
    double scale = 1;
    int good_steps = 0;
    int hysteresis_left = 0;
  };

  LossScaler(DType precision, const LossScaling& config);

  double scale() const { return state_.scale; }
  // Whether overflow can happen, so the gradient norm must be taken every step to find it.
  bool checks_overflow() const { return fp16_; }
  // After each step: an overflowing step lowers the scale (after the hysteresis), a good one counts.
  void update(bool overflow);

  const State& state() const { return state_; }
  void restore(const State& state) { state_ = state; }

 private:
  const LossScaling config_;
  const bool fp16_;
  State state_;
};

}  // namespace zero
