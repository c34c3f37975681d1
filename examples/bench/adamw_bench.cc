#include "examples/bench/adamw_bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "optim/optimizers.h"
#include "runtime/status.h"

namespace zero {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best time of `iterations` copies of `n` floats split statically over the OpenMP threads, each way:
// memcpy (which may use non-temporal stores) and a plain vectorized loop. The faster one is the bound.
double best_copy_seconds(int64_t n, int iterations) {
  std::vector<float> src(n, 1.0f), dst(n, 0.0f);
  float* __restrict d = dst.data();
  const float* __restrict s = src.data();
  double best = 1e30;
  for (int it = 0; it <= iterations; ++it) {
    for (bool use_memcpy : {true, false}) {
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
      {
        const int64_t per = (n + omp_get_num_threads() - 1) / omp_get_num_threads();
        const int64_t b = std::min(n, per * omp_get_thread_num()), e = std::min(n, b + per);
        if (use_memcpy) {
          std::memcpy(d + b, s + b, (e - b) * sizeof(float));
        } else {
          for (int64_t i = b; i < e; ++i) d[i] = s[i];
        }
      }
      if (it > 0) best = std::min(best, seconds_since(t0));  // the first pass faults the pages in
    }
  }
  return best;
}

}  // namespace

absl::StatusOr<AdamWBenchResult> bench_adamw_cpu(int64_t numel, int iterations) {
  if (numel < 1 || iterations < 1) return absl::InvalidArgumentError("bench_adamw_cpu needs numel and iterations >= 1");
  AdamWBenchResult r;
  r.numel = numel;
  r.threads = omp_get_max_threads();
  Allocator allocator;
  ZERO_ASSIGN_OR_RETURN(ShardLayout layout,
                        ShardLayout::create({{"w", 0, numel}}, {ParamGroup{1.0f, 0.01f}}, 0, numel));
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, make_adam({}, std::move(layout), allocator));
  std::vector<float> params(numel, 0.5f), grads(numel, 1e-3f);
  Tensor p(params.data(), DType::kF32, {numel}), g(grads.data(), DType::kF32, {numel});
  ZERO_RETURN_IF_ERROR(opt->step(p, g, 1, 1e-3f));  // warm-up: pages and threads
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 2; t <= iterations + 1; ++t) ZERO_RETURN_IF_ERROR(opt->step(p, g, t, 1e-3f));
  r.params_per_second = static_cast<double>(numel) * iterations / seconds_since(t0);
  r.copy_bytes_per_second = 2.0 * static_cast<double>(numel) * sizeof(float) / best_copy_seconds(numel, iterations);
  return r;
}

}  // namespace zero
