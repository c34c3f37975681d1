// zero-bench: benchmarks of zero's parts, one subcommand each, every number beside a baseline from the same run.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "examples/bench/comm_bench.h"
#include "examples/bench/kernels_bench.h"
#include "examples/bench/offload_bench.h"
#include "examples/bench/optim_bench.h"
#include "examples/bench/stages_bench.h"
#include "examples/common/tool_flags.h"
#include "runtime/comm/communicator.h"

namespace {

struct Subcommand {
  absl::string_view name;
  absl::string_view summary;
  absl::Status (*run)();
};

// Adding a subcommand: write its `absl::Status run()` (and its flags) beside comm_bench.cc, list it here.
constexpr Subcommand kSubcommands[] = {
    {"comm",
     "collective time, algbw and busbw per size (nccl-tests style) beside a copy on the same device "
     "(single-thread memcpy, or device-to-device with --device=cuda)",
     zero::comm_command},
    {"kernels",
     "CPU kernels' GFLOP/s (matmul, attention) beside raw cblas_sgemm and GB/s (elementwise, norms, "
     "cross-entropy) beside a parallel memcpy",
     zero::kernels_command},
    {"offload",
     "one GPT-2 per stage in RAM, with AdamW's state in NVMe files (--device=cpu) or in host memory (cuda, sim), and "
     "at stage 3 the parameters too: step time beside the RAM run's, bytes in memory and in files beside the formulas, "
     "the process's peak resident memory",
     zero::offload_command},
    {"optim", "AdamW parameters/s on one CPU shard beside the bound of its memory traffic and torch.optim.AdamW",
     zero::optim_command},
    {"stages",
     "one GPT-2 under ZeRO stages 0-3: peak memory per category and bytes sent beside the formulas, "
     "step time beside stage 0's",
     zero::stages_command},
};

std::string usage() {
  std::string text =
      "Benchmarks zero's parts; prints a table on rank 0 and, with --csv, writes it.\n\n"
      "usage: zero-bench <subcommand> [--flag=value ...]\n"
      "       mpirun -np N zero-bench <subcommand> --backend=mpi [--flag=value ...]\n"
      "       zero-bench <subcommand> --backend=nccl --device=cuda --ranks=N [...]   (one process driving N GPUs)\n\n"
      "subcommands:\n";
  for (const Subcommand& s : kSubcommands) absl::StrAppend(&text, "  ", s.name, "  ", s.summary, "\n");
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<char*> args = zero::parse_tool_flags(argc, argv, usage(), "examples/bench/");

  if (args.size() != 2) {
    std::fprintf(stderr, "zero-bench: give exactly one subcommand.\n%s(--help lists the flags)\n", usage().c_str());
    return 2;
  }
  const absl::string_view name = args[1];
  if (const absl::Status env = zero::CommOptions::parse_env().status(); !env.ok()) {
    std::fprintf(stderr, "zero-bench: %s\n", std::string(env.message()).c_str());
    return 2;
  }
  for (const Subcommand& s : kSubcommands) {
    if (s.name != name) continue;
    const absl::Status status = s.run();
    if (status.ok()) return 0;
    std::fprintf(stderr, "zero-bench %s: %s\n", std::string(name).c_str(), std::string(status.message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "zero-bench: unknown subcommand '%s'.\n%s", std::string(name).c_str(), usage().c_str());
  return 2;
}
