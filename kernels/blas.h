// The one place kernels call OpenBLAS: single-threaded sgemm over a fixed grid of output tiles.
#pragma once

#include <cstdint>

namespace zero::kernels::detail {

// Sets OpenBLAS to one thread, process-wide, once (openblas_set_num_threads is global in the pthread
// build; concurrent single-threaded calls are safe there, its buffer pool is locked).
void blas_single_threaded();

// C (M, N) = op(A) (M, K) · op(B) (K, N) + beta · C, row-major; op transposes when trans_* is set (A is
// then stored (K, M), B (N, K)). lda/ldb/ldc are the stored row strides.
struct Gemm {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float beta = 0;
  float* c = nullptr;
  int64_t ldc = 0;
};

// Runs g as one single-threaded sgemm per tile of a fixed grid over C, tiles split statically over the
// calling thread's OpenMP team. Every tile takes the whole K, so each element of C is computed by the
// same kernel path under any thread count.
void tiled_sgemm(const Gemm& g);

}  // namespace zero::kernels::detail
