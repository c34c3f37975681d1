#include "examples/common/tool_flags.h"

#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace zero {
namespace {

// A flag's source file from the repository root ("examples/zero_plan.cc"), not where this clone was built.
std::string repository_path(absl::string_view filename) {
  const size_t examples = filename.rfind("examples/");
  return std::string(examples == absl::string_view::npos ? filename : filename.substr(examples));
}

}  // namespace

std::vector<char*> parse_tool_flags(int argc, char** argv, absl::string_view usage, absl::string_view own_sources) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  const std::string sources(own_sources);
  config.contains_helpshort_flags = [sources](absl::string_view file) { return absl::StrContains(file, sources); };
  config.contains_help_flags = config.contains_helpshort_flags;
  config.normalize_filename = repository_path;
  config.version_string = [] { return absl::StrCat(absl::ProgramInvocationShortName(), " ", ZERO_VERSION, "\n"); };
  absl::SetFlagsUsageConfig(config);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace zero
