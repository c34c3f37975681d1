#include "examples/train/deepspeed_optim.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "optim/optimizers.h"

namespace zero::train {

OptimizerFactory optimizer_factory(const OptimizerConfig& o) {
  if (o.type == "SGD") {
    const SgdOptions options{.momentum = o.momentum};
    return [options](ShardLayout layout, Allocator& a, Device d) { return make_sgd(options, std::move(layout), a, d); };
  }
  if (o.type == "Lamb") {
    const LambOptions options{
        .beta1 = o.betas[0],
        .beta2 = o.betas[1],
        .eps = o.eps,
        .bias_correction = o.bias_correction ? LambBiasCorrection::kStepSize : LambBiasCorrection::kNone,
        .min_trust_ratio = o.min_coeff,
        .max_trust_ratio = o.max_coeff};
    return
        [options](ShardLayout layout, Allocator& a, Device d) { return make_lamb(options, std::move(layout), a, d); };
  }
  const AdamOptions options{.beta1 = o.betas[0],
                            .beta2 = o.betas[1],
                            .eps = o.eps,
                            .decoupled_weight_decay = o.type == "AdamW" || o.adam_w_mode};
  return [options](ShardLayout layout, Allocator& a, Device d) { return make_adam(options, std::move(layout), a, d); };
}

LrSchedule::LrSchedule(const SchedulerConfig& scheduler, double optimizer_lr, int64_t steps)
    : s_(scheduler), optimizer_lr_(optimizer_lr),
      total_(scheduler.total_num_steps > 0 ? scheduler.total_num_steps : steps),
      warmup_(std::max<int64_t>(2, scheduler.warmup_num_steps)) {}

double LrSchedule::warmup_fraction(int64_t i) const {
  if (s_.warmup_type == "log") return std::log(static_cast<double>(i + 1)) / std::log(static_cast<double>(warmup_));
  return static_cast<double>(i) / static_cast<double>(warmup_);
}

float LrSchedule::lr(int64_t step) const {
  const int64_t i = step - 1;
  if (s_.type.empty()) return static_cast<float>(optimizer_lr_);
  if (s_.type == "WarmupCosineLR") {
    if (i < warmup_) {
      return static_cast<float>(optimizer_lr_ * (s_.warmup_min_ratio + (1 - s_.warmup_min_ratio) * warmup_fraction(i)));
    }
    const double progress = static_cast<double>(i - warmup_ + 1) / static_cast<double>(total_ - warmup_);
    const double cosine = (1 + std::cos(std::numbers::pi * progress)) / 2;
    return static_cast<float>(optimizer_lr_ * std::max(0.0, s_.cos_min_ratio + (1 - s_.cos_min_ratio) * cosine));
  }
  double gamma = 1;
  if (i < warmup_) {
    gamma = warmup_fraction(i);
  } else if (s_.type == "WarmupDecayLR") {
    gamma =
        std::max(0.0, static_cast<double>(total_ - i) / static_cast<double>(std::max<int64_t>(1, total_ - warmup_)));
  }
  return static_cast<float>(s_.warmup_min_lr + (s_.warmup_max_lr - s_.warmup_min_lr) * gamma);
}

}  // namespace zero::train
