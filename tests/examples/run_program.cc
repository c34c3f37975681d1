#include "tests/examples/run_program.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace zero::testing {

RunResult run_program(const std::string& binary, const std::string& args, const std::string& launcher) {
  const std::string command = absl::StrCat(launcher, " ", binary, " ", args, " 2>&1");
  RunResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> chunk;
  while (size_t n = fread(chunk.data(), 1, chunk.size(), pipe)) result.output.append(chunk.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

RunResult run_program_killed_when(const std::string& binary, const std::string& args, const std::string& shell_test) {
  // The program in the background; the shell polls the condition every millisecond while it lives.
  const std::string script = absl::StrCat(binary, " ", args, " & pid=$!; until ", shell_test,
                                          "; do kill -0 $pid 2>/dev/null || break; sleep 0.001; done; "
                                          "kill -9 $pid 2>/dev/null; wait $pid");
  std::string quoted;  // one single-quoted shell word
  for (const char c : script) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return run_program("sh", absl::StrCat("-c '", quoted, "'"));
}

std::string mpiexec_launcher(const std::string& mpiexec, int ranks) {
  return absl::StrCat("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ", mpiexec, " -n ", ranks,
                      " --oversubscribe");
}

}  // namespace zero::testing
