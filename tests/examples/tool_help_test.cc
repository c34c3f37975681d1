// Every tool's --help and --version: exit 0, the tool's own flags, no path of the clone it was built in.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "tests/examples/run_program.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Tool {
  const char* name;
  const char* binary;
  const char* listed;  // a line --help must show
};

class ToolHelp : public ::testing::TestWithParam<Tool> {};

TEST_P(ToolHelp, ListsItsFlagsWithoutTheBuildsPathsAndExitsZero) {
  const testing::RunResult run = testing::run_program(GetParam().binary, "--help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat("usage: ", GetParam().name)));
  EXPECT_THAT(run.output, HasSubstr(GetParam().listed));
  EXPECT_THAT(run.output, Not(HasSubstr(ZERO_SOURCE_DIR)));
}

TEST_P(ToolHelp, VersionIsTheProjects) {
  const testing::RunResult run = testing::run_program(GetParam().binary, "--version");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_EQ(run.output, absl::StrCat(GetParam().name, " ", ZERO_VERSION, "\n"));
}

INSTANTIATE_TEST_SUITE_P(
    Tools, ToolHelp,
    ::testing::Values(Tool{"zero-train", ZERO_TRAIN_BINARY, "section \"Config reference (zero-train)\""},
                      Tool{"zero-plan", ZERO_PLAN_BINARY, "  Flags from examples/zero_plan.cc:\n    --batch ("},
                      Tool{"zero-bench", ZERO_BENCH_BINARY, "  Flags from examples/bench/bench_common.cc:"},
                      Tool{"custom_model", CUSTOM_MODEL_BINARY, "    --stage (ZeRO stage: 0, 1, 2 or 3); default: 3;"}),
    [](const ::testing::TestParamInfo<Tool>& info) {
      std::string name = info.param.name;
      for (char& c : name) c = c == '-' ? '_' : c;
      return name;
    });

}  // namespace
}  // namespace zero
