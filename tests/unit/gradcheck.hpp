// Central finite differences for fp32 code.
//
// Why these tolerances: the kernels run in fp32, so a loss of O(1..10) built from a few hundred
// terms carries rounding noise of ~1e-6. With step eps = 1e-2 on inputs of O(1) that noise adds
// ~5e-5 to a difference quotient and the O(eps^2) truncation term adds ~1e-4, so element-wise we
// allow |analytic - numeric| <= 2e-3 + 2e-2 |numeric|. The directional derivative along a random
// direction (all elements at once) sums many terms, so its relative error is far smaller: 2e-3.
// A wrong backward (a missing term, a transposed product, a wrong sign) misses by O(1) relative.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace gradcheck {

inline std::vector<float> randn(size_t n, float stddev, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Checks `grad` (analytic dL/dx) against finite differences of `loss` with respect to x[0..n):
// a random direction over all elements plus up to `samples` single elements.
inline void check(const std::string& what, const std::function<double()>& loss, float* x, const float* grad, size_t n,
                  size_t samples = 12, float eps = 1e-2f) {
  INFO(what);
  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> sign(-1.f, 1.f);
  std::vector<float> dir(n), saved(x, x + n);
  double analytic_dir = 0;
  // unit-norm direction, so the step is eps whatever n is (third-order terms stay ~eps^2)
  const float unit = 1.f / std::sqrt(static_cast<float>(n));
  for (size_t i = 0; i < n; ++i) {
    dir[i] = sign(gen) > 0 ? unit : -unit;
    analytic_dir += grad[i] * dir[i];
  }
  for (size_t i = 0; i < n; ++i) x[i] = saved[i] + eps * dir[i];
  double up = loss();
  for (size_t i = 0; i < n; ++i) x[i] = saved[i] - eps * dir[i];
  double down = loss();
  std::copy(saved.begin(), saved.end(), x);
  double numeric_dir = (up - down) / (2 * eps);
  INFO("directional derivative: analytic " << analytic_dir << " numeric " << numeric_dir);
  CHECK(std::abs(analytic_dir - numeric_dir) <= 1e-4 + 2e-3 * std::abs(numeric_dir));

  std::uniform_int_distribution<size_t> pick(0, n - 1);
  for (size_t s = 0; s < std::min(samples, n); ++s) {
    size_t i = samples >= n ? s : pick(gen);
    x[i] = saved[i] + eps;
    double u = loss();
    x[i] = saved[i] - eps;
    double d = loss();
    x[i] = saved[i];
    double numeric = (u - d) / (2 * eps);
    INFO("element " << i << ": analytic " << grad[i] << " numeric " << numeric);
    CHECK(std::abs(grad[i] - numeric) <= 2e-3 + 2e-2 * std::abs(numeric));
  }
}

// sum(out * r) in double: a scalar loss whose gradient w.r.t. out is r.
inline double dot(const std::vector<float>& out, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * r[i];
  return s;
}

}  // namespace gradcheck
