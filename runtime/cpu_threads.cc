#include "runtime/cpu_threads.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "runtime/status.h"

namespace zero {

int cpu_threads() { return omp_get_max_threads(); }

void set_cpu_threads(int threads) {
  ZERO_CHECK(threads >= 1, "set_cpu_threads(", threads, "): at least one thread");
  omp_set_num_threads(threads);
}

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, omp_get_num_procs());
}

void use_rank_share_of_cores(int ranks_sharing) {
  int threads = std::max(1, available_cores() / std::max(1, ranks_sharing));
  const char* env = std::getenv("OMP_NUM_THREADS");
  int cap = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &cap) && cap >= 1) threads = std::min(threads, cap);
  set_cpu_threads(threads);
}

}  // namespace zero
