// zero-train's progress line on a terminal: a bar where the width allows, never wider than the terminal.
#include "examples/train/report.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace zero::train {
namespace {

using ::testing::StartsWith;

constexpr char kText[] = "step  45/900  loss 1.7355  lr 2.95e-03  140938 tok/s  elapsed 0:02  eta 0:19";  // 76 chars

TEST(ProgressBarLine, AWideTerminalGetsTheWholeBarBeforeTheText) {
  const std::string line = progress_bar_line(kText, 450, 900, 200);
  EXPECT_EQ(line, absl::StrCat("[", std::string(15, '#'), std::string(15, '.'), "] ", kText));
}

TEST(ProgressBarLine, TheBarShrinksToTheColumnsTheTextLeaves) {
  // 100 columns: 99 usable, 76 of text and "[", "] " leave a bar of 20, 10 of it filled at half way.
  const std::string line = progress_bar_line(kText, 450, 900, 100);
  EXPECT_EQ(line.size(), 99u);
  EXPECT_THAT(line, StartsWith(absl::StrCat("[", std::string(10, '#'), std::string(10, '.'), "] step")));
}

TEST(ProgressBarLine, NoBarWhereItWouldBeUnderFiveAndTheTextIsCutToTheWidth) {
  EXPECT_EQ(progress_bar_line(kText, 450, 900, 80), kText);  // a bar of 79 - 76 - 3 = 0 < 5 columns
  EXPECT_EQ(progress_bar_line(kText, 450, 900, 40), std::string(kText).substr(0, 39));
}

}  // namespace
}  // namespace zero::train
