#include "examples/common/bench_python.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace zero {

std::string benchmark_python(absl::string_view chosen) {
  if (!chosen.empty()) return std::string(chosen);
  if (const char* env = std::getenv("ZERO_BENCH_PYTHON"); env != nullptr && *env != '\0') return env;
  const std::filesystem::path venv = std::filesystem::path(ZERO_SOURCE_DIR) / ".venv-bench" / "bin" / "python3";
  std::error_code ec;
  return std::filesystem::exists(venv, ec) ? venv.string() : "python3";
}

BaselineOutput run_baseline(const std::string& python, const std::string& script, const std::string& args) {
  BaselineOutput output;
  const std::filesystem::path errors =
      std::filesystem::temp_directory_path() / absl::StrCat("zero-baseline-", getpid(), ".err");
  FILE* out = popen(absl::StrCat(python, " ", script, " ", args, " 2>", errors.string()).c_str(), "r");
  if (out == nullptr) return output;
  char line[1024];
  while (std::fgets(line, sizeof line, out) != nullptr) {
    output.lines.emplace_back(absl::StripTrailingAsciiWhitespace(line));
  }
  pclose(out);
  std::ifstream err(errors);
  for (std::string l; std::getline(err, l);) {
    if (!absl::StripAsciiWhitespace(l).empty()) output.last_error_line = l;
  }
  std::error_code ec;
  std::filesystem::remove(errors, ec);
  return output;
}

std::string missing_torch_note(const std::string& python, const BaselineOutput& output) {
  if (!output.last_error_line.empty()) {
    return absl::StrCat("# no PyTorch baseline: ", python, " failed: ", output.last_error_line, "\n");
  }
  return absl::StrCat("# no PyTorch baseline: ", python,
                      " -c 'import torch' fails; scripts/bench_venv.sh installs the newest from PyPI into "
                      ".venv-bench (the default), or name a Python with --python / ZERO_BENCH_PYTHON\n");
}

}  // namespace zero
