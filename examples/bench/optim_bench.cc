#include "examples/bench/optim_bench.h"

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "examples/bench/adamw_bench.h"
#include "examples/bench/bench_common.h"
#include "examples/common/result_table.h"
#include "runtime/status.h"

ABSL_FLAG(int64_t, numel, 100'000'000, "optim: fp32 parameters in the AdamW shard (the issue's 100M by default)");

namespace zero {
namespace {

// torch.optim.AdamW's rate per variant, from examples/bench/torch_adamw.py (its comment lines echoed);
// empty when PyTorch is absent.
std::vector<std::pair<std::string, double>> torch_adamw_rates(int64_t numel, int iterations, int threads) {
  const std::string command = absl::StrCat("/usr/bin/python3 ", ZERO_TORCH_ADAMW_SCRIPT, " ", numel, " ", iterations,
                                           " ", threads, " 2>/dev/null");
  std::vector<std::pair<std::string, double>> rates;
  FILE* torch = popen(command.c_str(), "r");
  if (torch == nullptr) return rates;
  char line[256], name[64];
  double rate = 0;
  while (std::fgets(line, sizeof line, torch) != nullptr) {
    if (line[0] == '#') {
      std::fputs(line, stdout);  // the version, or a variant this PyTorch lacks
    } else if (std::sscanf(line, "%63s %lf", name, &rate) == 2) {
      rates.emplace_back(name, rate);
    }
  }
  pclose(torch);
  return rates;
}

}  // namespace

absl::Status optim_command() {
  const int64_t numel = absl::GetFlag(FLAGS_numel);
  if (numel < 1) return flag_error("numel", "must be >= 1");
  ZERO_ASSIGN_OR_RETURN(const Repetitions reps, repetitions_flags());
  ZERO_ASSIGN_OR_RETURN(const AdamWBenchResult r, bench_adamw_cpu(numel, reps.iters));
  std::printf(
      "# zero-bench optim: AdamW on %lld fp32 parameters, %d threads, %d steps; bound = parallel copy "
      "%.2f GB/s / %d bytes per parameter, same run\n",
      static_cast<long long>(numel), r.threads, reps.iters, r.copy_bytes_per_second / 1e9,
      AdamWBenchResult::kBytesPerParam);
  const auto torch = torch_adamw_rates(numel, reps.iters, r.threads);
  ResultTable table({{"implementation"}, {"params/s", 0}, {"zero_vs_it", 2}});
  table.add_row({std::string("zero AdamW"), r.params_per_second, 1.0});
  table.add_row({absl::StrCat("bandwidth bound (", AdamWBenchResult::kBytesPerParam, " B/param)"),
                 r.bound_params_per_second(), r.params_per_second / r.bound_params_per_second()});
  for (const auto& [variant, rate] : torch) {
    table.add_row({absl::StrCat("torch AdamW ", variant), rate, r.params_per_second / rate});
  }
  std::fputs(table.to_text().c_str(), stdout);
  if (torch.empty()) std::printf("# PyTorch not found (/usr/bin/python3 -c 'import torch' fails): no torch rows\n");
  return write_csv_flag(table);
}

}  // namespace zero
