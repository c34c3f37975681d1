// The optimizer and learning-rate schedule a DeepSpeed config's "optimizer" and "scheduler" sections name.
#pragma once

#include <cstdint>

#include "examples/train/train_config.h"
#include "shard/engine.h"

namespace zero::train {

// Adam (decoupled weight decay unless adam_w_mode is false, as DeepSpeed's), AdamW, Lamb (as DeepSpeed's
// FusedLamb: bias_correction, max_coeff, min_coeff) or SGD over each unit's shard. Weight decay itself is
// the engine's (ZeroConfig::weight_decay, per parameter group).
OptimizerFactory optimizer_factory(const OptimizerConfig& optimizer);

// DeepSpeed's lr_schedules.py, as a function of the optimizer step k = 1, 2, ... evaluated at DeepSpeed's
// last_batch_iteration i = k - 1 (DeepSpeed steps its scheduler after the optimizer, so its step k runs at
// i = k - 2 from k = 2 on; both give step 1 the warmup's start). W = max(2, warmup_num_steps),
// warmup fraction g = log(i + 1) / log(W) (log) or i / W (linear) while i < W:
//   WarmupLR        min_lr + (max_lr - min_lr) * (i < W ? g : 1)
//   WarmupDecayLR   the same, with (total - i) / (total - W) (>= 0) after warmup
//   WarmupCosineLR  lr * ratio: warmup_min_ratio + (1 - warmup_min_ratio) * g while i < W, then
//                   max(0, cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * (i - W + 1) / (total - W))) / 2)
//   none            the optimizer's lr
class LrSchedule {
 public:
  // `steps` stands in for total_num_steps when that is 0.
  LrSchedule(const SchedulerConfig& scheduler, double optimizer_lr, int64_t steps);
  float lr(int64_t step) const;

 private:
  double warmup_fraction(int64_t iteration) const;

  SchedulerConfig s_;
  double optimizer_lr_;
  int64_t total_;
  int64_t warmup_;
};

}  // namespace zero::train
