#include <omp.h>

#include "kernels/blas.h"
#include "kernels/kernels.h"
#include "runtime/status.h"

namespace zero::kernels {

void set_kernel_threads(int threads) {
  ZERO_CHECK(threads >= 1, "set_kernel_threads(", threads, "): at least one thread");
  detail::blas_single_threaded();
  omp_set_num_threads(threads);
}

int kernel_threads() { return omp_get_max_threads(); }

}  // namespace zero::kernels
