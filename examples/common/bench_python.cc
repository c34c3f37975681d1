#include "examples/common/bench_python.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

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

std::vector<std::string> run_baseline(const std::string& python, const std::string& script, const std::string& args) {
  std::vector<std::string> lines;
  FILE* out = popen(absl::StrCat(python, " ", script, " ", args, " 2>/dev/null").c_str(), "r");
  if (out == nullptr) return lines;
  char line[1024];
  while (std::fgets(line, sizeof line, out) != nullptr) lines.emplace_back(absl::StripTrailingAsciiWhitespace(line));
  pclose(out);
  return lines;
}

std::string missing_torch_note(const std::string& python) {
  return absl::StrCat("# no PyTorch baseline: ", python,
                      " -c 'import torch' fails; scripts/bench_venv.sh installs the newest from PyPI into "
                      ".venv-bench (the default), or name a Python with --python / ZERO_BENCH_PYTHON\n");
}

}  // namespace zero
