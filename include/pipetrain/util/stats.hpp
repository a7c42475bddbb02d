// Summaries of repeated measurements.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

namespace pipetrain {

// The middle value (the mean of the middle two for an even count); NaN for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// The median of `v` without its entry `skip`: one member against the rest (of two, a member twice
// as slow is 2x the other, not 1.33x the median of both).
inline double median_without(std::vector<double> v, size_t skip) {
  v.erase(v.begin() + static_cast<long>(skip));
  return median(std::move(v));
}

}  // namespace pipetrain
