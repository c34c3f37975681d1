// Renders a PNG with gnuplot from a CSV and a script, both kept beside it (PNG.csv, PNG.gp) to re-plot or reuse.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zero {

// FailedPrecondition, naming the package to install, when gnuplot is not on PATH.
absl::Status check_gnuplot();

// Writes `csv` to PNG.csv and `script` to PNG.gp, with "{png}" and "{csv}" in the script replaced by the two
// paths, and runs gnuplot on it.
absl::Status render_png(const std::string& png, absl::string_view csv, absl::string_view script);

}  // namespace zero
