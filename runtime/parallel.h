// OpenMP loops with a fixed split: work is cut into blocks whose bounds never depend on the thread count.
// Header-only; the loops run in parallel in targets built with OpenMP (kernels, optim).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace zero {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// fn(begin, end) for the blocks [0, block), [block, 2 block), ... of [0, n), split statically over the
// calling thread's OpenMP team (not woken for a single block). fn must only write what its block owns.
template <typename Fn>
void for_blocks(int64_t n, int64_t block, Fn&& fn) {
  const int64_t blocks = ceil_div(n, block);
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t i = 0; i < blocks; ++i) fn(i * block, std::min(n, (i + 1) * block));
}

// The sum of fn(begin, end) (a T with +=) over the blocks of [0, n), added in block order: the same bits
// under any thread count.
template <typename T, typename Fn>
T ordered_block_sum(int64_t n, int64_t block, Fn&& fn) {
  std::vector<T> partial(static_cast<size_t>(ceil_div(n, block)));
  for_blocks(n, block, [&](int64_t begin, int64_t end) { partial[begin / block] = fn(begin, end); });
  T total{};
  for (const T& p : partial) total += p;
  return total;
}

// out[c] += sum over rows r = 0..rows-1, in row order and in fp64, of term(r, c), for c in [0, cols).
// Columns are split over the threads; each column's sum is the same under any split.
template <typename Term>
void add_column_sums(int64_t rows, int64_t cols, float* out, Term&& term) {
  constexpr int64_t kCols = 64;
  for_blocks(cols, kCols, [&](int64_t c0, int64_t c1) {
    double acc[kCols] = {};
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += term(r, c);
    }
    for (int64_t c = c0; c < c1; ++c) out[c] += static_cast<float>(acc[c - c0]);
  });
}

}  // namespace zero
