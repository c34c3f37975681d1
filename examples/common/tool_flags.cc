#include "examples/common/tool_flags.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace zero {
namespace {

// A flag's source file from the repository root ("examples/zero_plan.cc"), not where this clone was built.
std::string repository_path(absl::string_view filename) {
  const size_t examples = filename.rfind("examples/");
  return std::string(examples == absl::string_view::npos ? filename : filename.substr(examples));
}

// The usage message, then the tool's own flags by source file and name, as absl lays them out.
void print_help(absl::string_view own_sources) {
  std::map<std::pair<std::string, std::string>, const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    std::string file = repository_path(flag->Filename());
    if (absl::StrContains(file, own_sources)) flags[{std::move(file), std::string(name)}] = flag;
  }
  std::printf("%s\n", std::string(absl::ProgramUsageMessage()).c_str());
  std::string file;
  for (const auto& [key, flag] : flags) {
    if (key.first != file) std::printf("\n  Flags from %s:\n", (file = key.first).c_str());
    std::printf("    --%s (%s); default: %s;\n", key.second.c_str(), flag->Help().c_str(),
                flag->DefaultValue().c_str());
  }
}

}  // namespace

std::vector<char*> parse_tool_flags(int argc, char** argv, absl::string_view usage, absl::string_view own_sources) {
  absl::SetProgramUsageMessage(usage);
  // Answered here rather than by absl, whose --help exits 1 and lists flags under the build's paths.
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "--helpfull") {
      print_help(own_sources);
      std::exit(0);
    }
    if (arg == "--version") {
      std::printf("%s %s\n", std::filesystem::path(argv[0]).filename().c_str(), ZERO_VERSION);
      std::exit(0);
    }
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace zero
