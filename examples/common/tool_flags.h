// The command line of zero's flag-driven tools (zero-plan, zero-bench, custom_model): --help lists the tool's own
// flags under their path in the repository, --version prints the project's version.
#pragma once

#include <vector>

#include "absl/strings/string_view.h"

namespace zero {

// Parses argv with absl's flags after setting `usage` as the --help text; `own_sources` is the path fragment of
// the tool's sources ("examples/bench/"), whose flags --help lists (not those of the libraries it links).
// --help and --version print and exit 0. Returns the positional arguments, argv[0] first.
std::vector<char*> parse_tool_flags(int argc, char** argv, absl::string_view usage, absl::string_view own_sources);

}  // namespace zero
