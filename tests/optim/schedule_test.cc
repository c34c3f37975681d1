#include "optim/schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace zero {
namespace {

Schedule make(ScheduleOptions o) { return *Schedule::create(std::move(o)); }

TEST(Schedule, ConstantIsThePeakAtEveryStep) {
  Schedule s = make({.kind = ScheduleKind::kConstant, .peak_lr = 0.5});
  EXPECT_EQ(s.lr(1), 0.5f);
  EXPECT_EQ(s.lr(1000000), 0.5f);
}

TEST(Schedule, WarmupRisesLinearlyToThePeak) {
  Schedule s = make({.kind = ScheduleKind::kWarmupCosine, .peak_lr = 1.0, .warmup_steps = 4, .total_steps = 8});
  EXPECT_EQ(s.lr(1), 0.25f);
  EXPECT_EQ(s.lr(2), 0.5f);
  EXPECT_EQ(s.lr(4), 1.0f);
}

TEST(Schedule, CosineDecaysThroughTheMidpointToTheFloor) {
  Schedule s =
      make({.kind = ScheduleKind::kWarmupCosine, .peak_lr = 1.0, .min_lr = 0.1, .warmup_steps = 4, .total_steps = 8});
  EXPECT_EQ(s.lr(6), 0.55f);  // half way: min + (peak - min) / 2
  EXPECT_EQ(s.lr(8), 0.1f);
  EXPECT_EQ(s.lr(100), 0.1f);
  EXPECT_EQ(s.lr(5), static_cast<float>(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4))));
}

TEST(Schedule, LinearDecaysToTheFloor) {
  Schedule s = make({.kind = ScheduleKind::kWarmupLinear, .peak_lr = 1.0, .warmup_steps = 0, .total_steps = 4});
  EXPECT_EQ(s.lr(1), 0.75f);
  EXPECT_EQ(s.lr(2), 0.5f);
  EXPECT_EQ(s.lr(4), 0.0f);
}

// Goyal et al. 2017: lr 0.1 per 256 images, batch 8192 -> 3.2, warmup over 5 "epochs", / 10 at milestones.
TEST(Schedule, LargeBatchScalesLinearlyWarmsUpGraduallyAndSteps) {
  Schedule s = make({.kind = ScheduleKind::kLargeBatch,
                     .warmup_steps = 5,
                     .base_lr = 0.1,
                     .reference_batch = 256,
                     .global_batch = 8192,
                     .milestones = {30, 60}});
  EXPECT_EQ(s.lr(1), static_cast<float>(0.1 + 3.1 / 5));
  EXPECT_EQ(s.lr(5), 3.2f);
  EXPECT_EQ(s.lr(30), 3.2f);
  EXPECT_EQ(s.lr(31), static_cast<float>(3.2 * 0.1));
  EXPECT_EQ(s.lr(61), static_cast<float>(3.2 * 0.1 * 0.1));
}

TEST(Schedule, RejectsWarmupLongerThanTraining) {
  EXPECT_FALSE(Schedule::create({.kind = ScheduleKind::kWarmupCosine, .warmup_steps = 10, .total_steps = 5}).ok());
}

TEST(Schedule, KindsAreNamedForTheConfig) {
  EXPECT_EQ(*schedule_kind_from_name("warmup_cosine"), ScheduleKind::kWarmupCosine);
  EXPECT_EQ(*schedule_kind_from_name("large_batch"), ScheduleKind::kLargeBatch);
  EXPECT_FALSE(schedule_kind_from_name("cosine").ok());
}

}  // namespace
}  // namespace zero
