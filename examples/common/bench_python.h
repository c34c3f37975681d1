// The Python whose PyTorch the benchmarks measure as their baseline: the newest from PyPI, in the project's
// .venv-bench (scripts/bench_venv.sh makes it), unless the user names another.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace zero {

// `chosen` if not empty (a --python flag), else $ZERO_BENCH_PYTHON, else <source tree>/.venv-bench/bin/python3
// where it exists, else python3 on PATH.
std::string benchmark_python(absl::string_view chosen = "");

// What `python script args` printed: its stdout's lines (results), and the last line of its stderr (PyTorch's
// warnings go there too, so only a failed run's is worth showing).
struct BaselineOutput {
  std::vector<std::string> lines;
  std::string last_error_line;
};
BaselineOutput run_baseline(const std::string& python, const std::string& script, const std::string& args);

// A line for a benchmark whose baseline gave no result: the Python tried, and why (its error, or how to get
// PyTorch there).
std::string missing_torch_note(const std::string& python, const BaselineOutput& output);

}  // namespace zero
