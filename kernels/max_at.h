// The first-maximum scan of a row (its largest value and the lowest index holding it), for the CUDA cross-entropy's
// argmax; host and device share it so the CPU tests check the code the GPU runs.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/host_device.h"

namespace zero::kernels {

struct MaxAt {
  float value;
  int64_t index;
};

// The larger value; on ties the lower index, as the CPU's first-maximum scan. A NaN never wins.
ZERO_HD MaxAt max_at(MaxAt a, MaxAt b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

// max_at folded over x's first `count` values (count >= 1), at indices v, v + 1, ... (m's index below v, or past
// every index): the largest value first, one fmax an element (IEEE maxNum: a NaN never wins, as in max_at), then,
// only where it beats m, the first element holding it, with its own value (a -0 where +0 ties it, as the fold keeps).
template <int N>
ZERO_HD MaxAt max_at_chunk(MaxAt m, const float (&x)[N], int64_t v, int64_t count) {
  float largest = x[0];
  for (int e = 1; e < N; ++e) {  // constant bounds keep x in registers
#if defined(__CUDA_ARCH__)
    if (e < count) largest = fmaxf(largest, x[e]);
#else
    if (e < count) largest = std::fmax(largest, x[e]);
#endif
  }
  if (!(largest > m.value || (largest == m.value && v < m.index))) return m;
  for (int e = 0; e < N; ++e) {
    if (e < count && x[e] == largest) return MaxAt{x[e], v + e};
  }
  return m;  // not reached: some element holds the largest
}

// The CPU's argmax (crossentropy.cc: std::max folded from x[0], then the first column holding the result) from
// `best`, max_at's scan of the row's vocab columns from {-FLT_MAX, vocab}, and the row's x[0]: column 0 where x[0] is
// a NaN (the fold keeps it, and no column equals it) or where no column beat the scan's start (all -inf or NaN, x[0]
// then the fold's -inf).
ZERO_HD int64_t argmax_as_cpu(MaxAt best, float first, int64_t vocab) {
  const bool first_is_nan = first != first;
  return first_is_nan || best.index == vocab ? 0 : best.index;
}

}  // namespace zero::kernels
