// AdamW on a 100M-parameter CPU shard: zero vs torch.optim.AdamW (same run) vs the memcpy bandwidth bound.
// Usage: optim_bench [numel=100000000] [iterations=5]. PyTorch is optional: /usr/bin/python3 with torch.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "optim/bench.h"

int main(int argc, char** argv) {
  const int64_t numel = argc > 1 ? std::atoll(argv[1]) : 100'000'000;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 5;
  absl::StatusOr<zero::AdamWBenchResult> r = zero::bench_adamw_cpu(numel, iterations);
  if (!r.ok()) {
    std::fprintf(stderr, "optim_bench: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  std::printf("AdamW, %lld fp32 params, %d threads, %d steps\n", static_cast<long long>(numel), r->threads, iterations);
  std::printf("  zero                  %.3g params/s\n", r->params_per_second);
  std::printf("  bandwidth bound       %.3g params/s  (copy %.2f GB/s over %d bytes/param); zero at %.2fx of it\n",
              r->bound_params_per_second(), r->copy_bytes_per_second / 1e9, zero::AdamWBenchResult::kBytesPerParam,
              r->params_per_second / r->bound_params_per_second());
  const std::string cmd = "/usr/bin/python3 " ZERO_BENCH_SCRIPT " " + std::to_string(numel) + " " +
                          std::to_string(iterations) + " " + std::to_string(r->threads) + " 2>/dev/null";
  FILE* torch = popen(cmd.c_str(), "r");
  char line[256], name[64];
  double rate = 0;
  bool any = false;
  while (torch != nullptr && std::fgets(line, sizeof line, torch) != nullptr) {
    if (std::sscanf(line, "%63s %lf", name, &rate) == 2 && name[0] != '#' && std::string(name) != "torch") {
      std::printf("  torch AdamW %-10s %.3g params/s; zero is %.2fx\n", name, rate, r->params_per_second / rate);
      any = true;
    } else {
      std::printf("  %s", line);
    }
  }
  if (torch != nullptr) pclose(torch);
  if (!any) std::printf("  (PyTorch not found: /usr/bin/python3 -c 'import torch' fails; no comparison)\n");
  return 0;
}
