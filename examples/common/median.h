// The median of timings, as benchmarks report a step: robust to the odd slow one (a page fault, a descheduled
// thread) that a mean carries.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace zero {

// 0 for none; for an even count, the mean of the middle two.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  if (values.size() % 2 == 1) return *middle;
  return (*middle + *std::max_element(values.begin(), middle)) / 2;
}

}  // namespace zero
