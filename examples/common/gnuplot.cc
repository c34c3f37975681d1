#include "examples/common/gnuplot.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "runtime/atomic_file.h"
#include "runtime/status.h"

namespace zero {

absl::Status check_gnuplot() {
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "needs gnuplot on PATH (apt-get install gnuplot-nox; scripts/install_deps.sh does)");
}

absl::Status render_png(const std::string& png, absl::string_view csv, absl::string_view script) {
  ZERO_RETURN_IF_ERROR(check_gnuplot());
  const std::string csv_path = png + ".csv", script_path = png + ".gp";
  ZERO_RETURN_IF_ERROR(write_file_atomically(csv_path, {csv}));
  ZERO_RETURN_IF_ERROR(
      write_file_atomically(script_path, {absl::StrReplaceAll(script, {{"{png}", png}, {"{csv}", csv_path}})}));
  if (std::system(absl::StrCat("gnuplot '", script_path, "'").c_str()) != 0) {
    return absl::InternalError(absl::StrCat("gnuplot failed on ", script_path));
  }
  return absl::OkStatus();
}

}  // namespace zero
