// zero-train's loss curve: training and validation loss and the learning rate against step, from a metrics
// file, drawn by gnuplot into a PNG (with its data beside it as PNG.csv).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace zero::train {

// The metrics file's "train" and "eval" lines as CSV: step,loss,val_loss,lr, one row per training step;
// val_loss is "nan" (gnuplot's missing value) at steps without an evaluation. InvalidArgument naming the file
// and line when a line is not JSON, or when there is no training step to draw.
absl::StatusOr<std::string> loss_curve_csv(const std::string& metrics_path);

// Draws `metrics_path` into `png`; returns the line zero-train prints ("loss curve: PNG (data PNG.csv)").
absl::StatusOr<std::string> plot_loss_curve(const std::string& metrics_path, const std::string& png);

}  // namespace zero::train
