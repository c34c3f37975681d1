// Learning-rate schedules as a function of the step: constant, warmup + cosine/linear decay, large-batch.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zero {

enum class ScheduleKind : uint8_t {
  kConstant,      // peak_lr
  kWarmupCosine,  // linear warmup 0 -> peak over warmup_steps, cosine decay to min_lr at total_steps
  kWarmupLinear,  // linear warmup 0 -> peak, linear decay to min_lr at total_steps
  kLargeBatch,    // Goyal et al. 2017: peak = base_lr * global_batch / reference_batch, gradual warmup
                  // from base_lr to peak over warmup_steps, then x decay_factor at each milestone
};

// "constant", "warmup_cosine", "warmup_linear", "large_batch" (the names a config uses).
absl::StatusOr<ScheduleKind> schedule_kind_from_name(absl::string_view name);

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::kConstant;
  double peak_lr = 1e-3;  // kLargeBatch derives it from base_lr instead
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // the decaying kinds only
  // kLargeBatch
  double base_lr = 0.1;
  int64_t reference_batch = 256;
  int64_t global_batch = 256;
  std::vector<int64_t> milestones = {};  // steps after which the lr is multiplied by decay_factor
  double decay_factor = 0.1;
};

class Schedule {
 public:
  // Fails with InvalidArgument on negative rates, warmup past total_steps, or batches < 1.
  static absl::StatusOr<Schedule> create(ScheduleOptions options);
  // The learning rate of step `step` (counting from 1, as Optimizer::step does).
  float lr(int64_t step) const;
  const ScheduleOptions& options() const { return options_; }

 private:
  explicit Schedule(ScheduleOptions options) : options_(std::move(options)) {}
  double decay(int64_t step, double peak) const;
  ScheduleOptions options_;
};

}  // namespace zero
