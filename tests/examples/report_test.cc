// What zero-train shows: the progress line on a terminal (a bar where the width allows, never wider than the
// terminal) and the loss curve's data drawn from a metrics file.
#include "examples/train/report.h"

#include <fstream>

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "examples/train/loss_plot.h"
#include "tests/temp_dir.h"

namespace zero::train {
namespace {

using ::testing::HasSubstr;
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

TEST(StepTime, IsTheMedianOfTheStepsAfterTheFirst) {
  EXPECT_EQ(median_after_warmup({}), 0);
  EXPECT_EQ(median_after_warmup({5}), 5);                  // one step: its own time
  EXPECT_EQ(median_after_warmup({100, 1, 3, 2}), 2);       // the first, warming up, is left out
  EXPECT_EQ(median_after_warmup({100, 4, 1, 3, 2}), 2.5);  // an even count: the middle two's mean
}

TEST(LossCurve, OneRowPerTrainingStepWithTheValidationLossWhereThereWasOne) {
  const testing::ScopedTempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  std::ofstream(path) << R"({"event":"train","step":1,"loss":2.5,"lr":0.0}
{"event":"train","step":2,"loss":2.25,"lr":0.001}
{"event":"eval","step":2,"val_loss":2.375}
{"event":"train","step":3,"loss":2.0,"lr":0.0005}
{"event":"summary","steps":3}
)";
  const absl::StatusOr<std::string> csv = loss_curve_csv(path);
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_EQ(*csv, "step,loss,val_loss,lr\n1,2.5,nan,0\n2,2.25,2.375,0.001\n3,2,nan,0.0005\n");
}

TEST(LossCurve, ADivergedRunsNonFiniteLossesAreGapsInTheCurve) {
  // JSON has no NaN: the metrics file holds null where a loss was not finite.
  const testing::ScopedTempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  std::ofstream(path) << R"({"event":"train","step":1,"loss":2.5,"lr":0.001}
{"event":"train","step":2,"loss":null,"lr":0.001}
{"event":"eval","step":2,"val_loss":null}
)";
  const absl::StatusOr<std::string> csv = loss_curve_csv(path);
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_EQ(*csv, "step,loss,val_loss,lr\n1,2.5,nan,0.001\n2,nan,nan,0.001\n");
}

TEST(LossCurve, ALineThatIsNotJsonOrNoTrainingStepIsRefusedNamingTheFile) {
  const testing::ScopedTempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  std::ofstream(path) << "{\"event\":\"train\",\"step\":1,\"loss\":2.5,\"lr\":0}\n{\"event\":\n";
  EXPECT_THAT(loss_curve_csv(path).status().message(), HasSubstr(absl::StrCat(path, ", line 2: not a JSON object")));
  std::ofstream(path) << "{\"event\":\"summary\"}\n";
  EXPECT_THAT(loss_curve_csv(path).status().message(), HasSubstr("no training step to draw"));
  std::ofstream(path) << "{\"event\":\"train\",\"step\":\"one\",\"loss\":2.5}\n";
  EXPECT_THAT(loss_curve_csv(path).status().message(), HasSubstr(", line 1: a \"train\" line needs a step"));
  EXPECT_THAT(loss_curve_csv(dir.file("absent.jsonl")).status().message(), HasSubstr("cannot open it"));
}

}  // namespace
}  // namespace zero::train
