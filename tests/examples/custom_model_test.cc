// custom_model run end to end: a flag out of range is named as typed (exit 2), and a run frees every activation.

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/examples/run_program.h"

namespace zero {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

testing::RunResult run_custom_model(const std::string& args) { return testing::run_program(CUSTOM_MODEL_BINARY, args); }

TEST(CustomModelTest, AStageOutOfRangeNamesTheFlag) {
  const testing::RunResult run = run_custom_model("--stage=5 --ranks=2 --steps=2");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(run.output, "custom_model: --stage=5: ZeRO stages are 0, 1, 2 and 3\n");
}

TEST(CustomModelTest, FewerThanOneRankNamesTheFlagInsteadOfCrashing) {
  const testing::RunResult run = run_custom_model("--ranks=0 --steps=2");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(run.output, "custom_model: --ranks=0: at least one rank is needed\n");
}

// Output's backward hands d(loss)/dh to hidden's, which frees it: no activation outlives the step.
TEST(CustomModelTest, EveryActivationIsFreedByTheEndOfTheRun) {
  const testing::RunResult run = run_custom_model("--stage=3 --ranks=2 --steps=20");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("loss fell from"));
  EXPECT_THAT(run.output, ContainsRegex("\nactivations +0 B +[0-9.]+ KiB\n"));
  EXPECT_THAT(run.output, Not(HasSubstr("outlived")));
}

}  // namespace
}  // namespace zero
