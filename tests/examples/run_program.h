// Runs an example program the way a user does, for the end-to-end tests: its exit code and all it printed.
#pragma once

#include <string>

namespace zero::testing {

struct RunResult {
  int exit_code = -1;  // -1 when it could not be started or did not exit normally
  std::string output;  // stdout and stderr together
};

// Runs `launcher binary args` through the shell (launcher: e.g. "mpiexec -np 2", or empty).
RunResult run_program(const std::string& binary, const std::string& args, const std::string& launcher = "");

// Runs `binary args` as run_program does, and kills it (SIGKILL) as soon as `shell_test` (a shell condition, as
// `[ -e file ]`) holds while it runs: exit_code 137 when the kill landed, else the program's own.
RunResult run_program_killed_when(const std::string& binary, const std::string& args, const std::string& shell_test);

// The launcher of `ranks` processes under `mpiexec` (its path), oversubscribing the cores and allowed to run
// as root, as in CI's containers.
std::string mpiexec_launcher(const std::string& mpiexec, int ranks);

}  // namespace zero::testing
