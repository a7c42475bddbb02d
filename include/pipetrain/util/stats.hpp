// Summaries of repeated measurements.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace pipetrain {

// The middle value (the mean of the middle two for an even count); NaN for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace pipetrain
