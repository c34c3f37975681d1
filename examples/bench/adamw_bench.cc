#include "examples/bench/adamw_bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "examples/bench/bench_common.h"
#include "examples/common/median.h"
#include "optim/optimizers.h"
#include "runtime/status.h"

namespace zero {
namespace {

// Best time of `iterations` passes over AdamW's four arrays of `n` floats, split statically over the OpenMP threads
// as the optimizer splits them: p, m and v are read and written in place, g is read, with one multiply-add each,
// so the pass moves AdamW's 28 bytes per element at the memory's pace.
double best_traffic_seconds(int64_t n, int iterations) {
  std::vector<float> p(n, 0.5f), g(n, 1e-3f), m(n, 0.0f), v(n, 0.0f);
  float* __restrict pp = p.data();
  float* __restrict mp = m.data();
  float* __restrict vp = v.data();
  const float* __restrict gp = g.data();
  double best = 1e30;
  for (int it = 0; it <= iterations; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    {
      const int64_t per = (n + omp_get_num_threads() - 1) / omp_get_num_threads();
      const int64_t b = std::min(n, per * omp_get_thread_num()), e = std::min(n, b + per);
      for (int64_t i = b; i < e; ++i) {
        mp[i] = 0.9f * mp[i] + gp[i];
        vp[i] = 0.999f * vp[i] + gp[i];
        pp[i] = pp[i] - 1e-9f * mp[i];
      }
    }
    if (it > 0) best = std::min(best, seconds_since(t0));  // the first pass faults the pages in
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
  std::vector<double> step_seconds;
  for (int t = 2; t <= iterations + 1; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    ZERO_RETURN_IF_ERROR(opt->step(p, g, t, 1e-3f));
    step_seconds.push_back(seconds_since(t0));
  }
  r.params_per_second = static_cast<double>(numel) / median(step_seconds);
  r.bound_params_per_second = static_cast<double>(numel) / best_traffic_seconds(numel, iterations);
  return r;
}

}  // namespace zero
