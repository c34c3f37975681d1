#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace zero {

absl::StatusOr<ScheduleKind> schedule_kind_from_name(absl::string_view name) {
  if (name == "constant") return ScheduleKind::kConstant;
  if (name == "warmup_cosine") return ScheduleKind::kWarmupCosine;
  if (name == "warmup_linear") return ScheduleKind::kWarmupLinear;
  if (name == "large_batch") return ScheduleKind::kLargeBatch;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule '", name, "'; use constant, warmup_cosine, warmup_linear or large_batch"));
}

absl::StatusOr<Schedule> Schedule::create(ScheduleOptions o) {
  if (o.peak_lr < 0 || o.min_lr < 0 || o.base_lr < 0 || o.warmup_steps < 0) {
    return absl::InvalidArgumentError("schedule rates and warmup_steps must be non-negative");
  }
  const bool decays = o.kind == ScheduleKind::kWarmupCosine || o.kind == ScheduleKind::kWarmupLinear;
  if (decays && o.total_steps <= o.warmup_steps) {
    return absl::InvalidArgumentError(absl::StrCat("total_steps ", o.total_steps, " must exceed warmup_steps ",
                                                   o.warmup_steps, " for a decaying schedule"));
  }
  if (o.reference_batch < 1 || o.global_batch < 1) {
    return absl::InvalidArgumentError("reference_batch and global_batch must be at least 1");
  }
  std::sort(o.milestones.begin(), o.milestones.end());
  return Schedule(std::move(o));
}

double Schedule::decay(int64_t step, double peak) const {
  const ScheduleOptions& o = options_;
  const double progress = std::clamp(
      static_cast<double>(step - o.warmup_steps) / static_cast<double>(o.total_steps - o.warmup_steps), 0.0, 1.0);
  const double shape =
      o.kind == ScheduleKind::kWarmupCosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) : 1.0 - progress;
  return o.min_lr + (peak - o.min_lr) * shape;
}

float Schedule::lr(int64_t step) const {
  const ScheduleOptions& o = options_;
  switch (o.kind) {
    case ScheduleKind::kConstant: return static_cast<float>(o.peak_lr);
    case ScheduleKind::kWarmupCosine:
    case ScheduleKind::kWarmupLinear:
      if (step <= o.warmup_steps) return static_cast<float>(o.peak_lr * step / o.warmup_steps);
      return static_cast<float>(decay(step, o.peak_lr));
    case ScheduleKind::kLargeBatch: {
      const double peak = o.base_lr * static_cast<double>(o.global_batch) / static_cast<double>(o.reference_batch);
      if (step <= o.warmup_steps) {
        return static_cast<float>(o.base_lr + (peak - o.base_lr) * static_cast<double>(step) / o.warmup_steps);
      }
      const auto passed = std::upper_bound(o.milestones.begin(), o.milestones.end(), step - 1) - o.milestones.begin();
      return static_cast<float>(peak * std::pow(o.decay_factor, static_cast<double>(passed)));
    }
  }
  return 0.0f;
}

}  // namespace zero
