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

// The lines `python script args` prints on stdout (its stderr dropped: PyTorch's warnings); none when it could not
// start or printed nothing.
std::vector<std::string> run_baseline(const std::string& python, const std::string& script, const std::string& args);

// A line for a benchmark whose baseline could not run: which Python was tried and how to get PyTorch there.
std::string missing_torch_note(const std::string& python);

}  // namespace zero
