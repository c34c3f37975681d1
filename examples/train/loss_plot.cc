#include "examples/train/loss_plot.h"

#include <fstream>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/common/gnuplot.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"

namespace zero::train {
namespace {

// Loss on the left axis, the learning rate on the right; validation losses as points joined across the
// steps without one.
constexpr char kScript[] = R"(set datafile separator ','
set datafile missing 'nan'
set terminal pngcairo noenhanced size 1000,560 font ',10'
set output '{png}'
set title 'zero-train'
set xlabel 'step'
set ylabel 'loss'
set y2label 'learning rate'
set ytics nomirror
set y2tics
set format y2 '%.1e'
set key top right
plot '{csv}' using 1:2 with lines lw 1.5 title 'training loss', \
     '' using 1:3 with linespoints pt 7 lw 1.5 title 'validation loss', \
     '' using 1:4 axes x1y2 with lines dt 2 lc rgb 'gray40' title 'learning rate'
)";

struct StepPoint {
  double loss = 0;
  double lr = 0;
};

// A number from the metrics file; NaN where the writer had a non-finite value (JSON has none: it wrote null).
double number_or_nan(const nlohmann::json& record, const char* key) {
  const auto it = record.find(key);
  return it != record.end() && it->is_number() ? it->get<double>() : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

absl::StatusOr<std::string> loss_curve_csv(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("metrics file ", metrics_path, ": cannot open it"));
  std::map<int64_t, StepPoint> steps;
  std::map<int64_t, double> evals;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics file ", metrics_path, ", line ", number, ": not a JSON object"));
    }
    const auto event = record.find("event");
    const bool train = event != record.end() && *event == "train", eval = event != record.end() && *event == "eval";
    if (!train && !eval) continue;
    const auto step = record.find("step");
    if (step == record.end() || !step->is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics file ", metrics_path, ", line ", number, ": a ", event->dump(), " line needs a step"));
    }
    if (train) steps[step->get<int64_t>()] = {number_or_nan(record, "loss"), number_or_nan(record, "lr")};
    if (eval) evals[step->get<int64_t>()] = number_or_nan(record, "val_loss");
  }
  if (steps.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics file ", metrics_path, ": no training step to draw"));
  }
  std::string csv = "step,loss,val_loss,lr\n";
  for (const auto& [step, p] : steps) {
    const auto eval = evals.find(step);
    absl::StrAppendFormat(&csv, "%d,%.6g,%s,%.6g\n", step, p.loss,
                          eval == evals.end() ? "nan" : absl::StrFormat("%.6g", eval->second), p.lr);
  }
  return csv;
}

absl::StatusOr<std::string> plot_loss_curve(const std::string& metrics_path, const std::string& png) {
  ZERO_ASSIGN_OR_RETURN(const std::string csv, loss_curve_csv(metrics_path));
  ZERO_RETURN_IF_ERROR(render_png(png, csv, kScript));
  return absl::StrCat("loss curve: ", png, " (data ", png, ".csv)");
}

}  // namespace zero::train
