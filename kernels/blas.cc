#include "kernels/blas.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>

#include "runtime/parallel.h"

namespace zero::kernels::detail {
namespace {

// Tile sides: large enough that packing a tile's panels costs little beside its 2·K·kTileM·kTileN flops,
// small enough that GPT-2-sized outputs give every thread several tiles.
constexpr int64_t kTileM = 256;
constexpr int64_t kTileN = 512;

}  // namespace

void blas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void tiled_sgemm(const Gemm& g) {
  if (g.m == 0 || g.n == 0) return;
  blas_single_threaded();
  const int64_t tiles_n = ceil_div(g.n, kTileN);
  for_blocks(ceil_div(g.m, kTileM) * tiles_n, 1, [&](int64_t tile, int64_t) {
    const int64_t i0 = (tile / tiles_n) * kTileM, j0 = (tile % tiles_n) * kTileN;
    const int64_t m = std::min(kTileM, g.m - i0), n = std::min(kTileN, g.n - j0);
    const float* a = g.a + (g.trans_a ? i0 : i0 * g.lda);
    const float* b = g.b + (g.trans_b ? j0 * g.ldb : j0);
    cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(g.k), 1.0f, a, static_cast<int>(g.lda), b,
                static_cast<int>(g.ldb), g.beta, g.c + i0 * g.ldc + j0, static_cast<int>(g.ldc));
  });
}

}  // namespace zero::kernels::detail
