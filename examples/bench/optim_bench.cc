#include "examples/bench/optim_bench.h"

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "examples/bench/adamw_bench.h"
#include "examples/bench/bench_common.h"
#include "examples/common/bench_python.h"
#include "examples/common/result_table.h"
#include "runtime/status.h"

ABSL_FLAG(int64_t, numel, 100'000'000, "optim: fp32 parameters in the AdamW shard (the issue's 100M by default)");

namespace zero {
namespace {

// torch.optim.AdamW's rate per variant, from examples/bench/torch_adamw.py's lines (its comment lines echoed).
std::vector<std::pair<std::string, double>> torch_adamw_rates(const std::vector<std::string>& lines) {
  std::vector<std::pair<std::string, double>> rates;
  for (const std::string& line : lines) {
    char name[64];
    double rate = 0;
    if (absl::StartsWith(line, "#")) {
      std::printf("%s\n", line.c_str());  // the version, or a variant this PyTorch lacks
    } else if (std::sscanf(line.c_str(), "%63s %lf", name, &rate) == 2) {
      rates.emplace_back(name, rate);
    }
  }
  return rates;
}

}  // namespace

absl::Status optim_command() {
  const int64_t numel = absl::GetFlag(FLAGS_numel);
  if (numel < 1) return flag_error("numel", "must be >= 1");
  ZERO_ASSIGN_OR_RETURN(const Repetitions reps, repetitions_flags());
  ZERO_ASSIGN_OR_RETURN(const AdamWBenchResult r, bench_adamw_cpu(numel, reps.iters));
  std::printf(
      "# zero-bench optim: AdamW on %lld fp32 parameters, %d threads, %d steps; bound = AdamW's traffic (%d bytes "
      "per parameter: reads p, g, m, v, writes p, m, v) with a multiply-add where AdamW has its math, %.2f GB/s, same "
      "run\n",
      static_cast<long long>(numel), r.threads, reps.iters, AdamWBenchResult::kBytesPerParam,
      r.bound_bytes_per_second() / 1e9);
  const std::string python = benchmark_python(absl::GetFlag(FLAGS_python));
  const BaselineOutput torch_run =
      run_baseline(python, ZERO_TORCH_ADAMW_SCRIPT, absl::StrCat(numel, " ", reps.iters, " ", r.threads));
  const auto torch = torch_adamw_rates(torch_run.lines);
  ResultTable table({{"implementation"}, {"params/s", 0}, {"zero_vs_it", 2}});
  table.add_row({std::string("zero AdamW"), r.params_per_second, 1.0});
  table.add_row({absl::StrCat("memory bound (", AdamWBenchResult::kBytesPerParam, " B/param)"),
                 r.bound_params_per_second, r.params_per_second / r.bound_params_per_second});
  for (const auto& [variant, rate] : torch) {
    table.add_row({absl::StrCat("torch AdamW ", variant), rate, r.params_per_second / rate});
  }
  std::fputs(table.to_text().c_str(), stdout);
  if (torch.empty()) std::fputs(missing_torch_note(python, torch_run).c_str(), stdout);
  return write_csv_flag(table);
}

}  // namespace zero
