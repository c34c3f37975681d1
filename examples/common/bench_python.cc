#include "examples/common/bench_python.h"

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace zero {

std::string benchmark_python(absl::string_view chosen) {
  if (!chosen.empty()) return std::string(chosen);
  if (const char* env = std::getenv("ZERO_BENCH_PYTHON"); env != nullptr && *env != '\0') return env;
  const std::filesystem::path venv = std::filesystem::path(ZERO_SOURCE_DIR) / ".venv-bench" / "bin" / "python3";
  std::error_code ec;
  return std::filesystem::exists(venv, ec) ? venv.string() : "python3";
}

std::string missing_torch_note(const std::string& python) {
  return absl::StrCat("# no PyTorch baseline: ", python,
                      " -c 'import torch' fails; scripts/bench_venv.sh installs the newest from PyPI into "
                      ".venv-bench (the default), or name a Python with --python / ZERO_BENCH_PYTHON\n");
}

}  // namespace zero
