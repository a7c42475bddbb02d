// What the GPU kernel tests share: random inputs, copies to and from the GPU, and the comparison
// with the CPU's results.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "pipetrain/compute/gpu.hpp"

namespace pipetrain::gpu_test {

using Vec = std::vector<float>;

inline Vec randn(size_t n, float scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, scale);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}
// Uniform in [-scale, scale) from a hash of the index: for the production shapes' gigabytes,
// where a normal distribution would take longer to draw than the kernels take to run.
inline Vec uniform(size_t n, float scale, uint64_t seed) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull + seed;  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    v[i] = scale * (static_cast<float>(z >> 40) / 8388608.f - 1.f);
  }
  return v;
}
inline std::vector<int> tokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int> t(n);
  for (auto& x : t) x = static_cast<int>(gen() % vocab);
  return t;
}

template <class T>
gpu::Buffer<T> up(const std::vector<T>& host) {
  gpu::Buffer<T> d(host.size());
  gpu::copy_to_device(d.data(), host.data(), sizeof(T) * host.size());
  return d;
}
template <class T>
std::vector<T> down(const gpu::Buffer<T>& d) {
  std::vector<T> host(d.size());
  gpu::copy_to_host(host.data(), d.data(), sizeof(T) * d.size());
  return host;
}
// Rows `rows` (of `width` values each) of a device array, one after another.
inline Vec down_rows(const float* d, size_t width, const std::vector<size_t>& rows) {
  Vec host(rows.size() * width);
  for (size_t i = 0; i < rows.size(); ++i)
    gpu::copy_to_host(host.data() + i * width, d + rows[i] * width, sizeof(float) * width);
  return host;
}
// The same rows of a host array.
inline Vec host_rows(const float* h, size_t width, const std::vector<size_t>& rows) {
  Vec out;
  for (size_t r : rows) out.insert(out.end(), h + r * width, h + (r + 1) * width);
  return out;
}

// Largest |got - want| relative to the largest |want| (fp32 kernels differ from the CPU only in
// summation order and libm: ~1e-6 of the magnitude).
inline double rel_err(const Vec& got, const Vec& want) {
  REQUIRE(got.size() == want.size());
  double diff = 0, mag = 1e-30;
  for (size_t i = 0; i < got.size(); ++i)
    diff = std::max(diff, std::fabs(double(got[i]) - want[i])), mag = std::max(mag, std::fabs(double(want[i])));
  return std::isfinite(diff) ? diff / mag : INFINITY;
}
constexpr double kFp32 = 2e-5;

inline float to_bf16(float x) {  // round to nearest even, as __float2bfloat16_rn
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}
inline Vec rounded(Vec v) {
  for (auto& x : v) x = to_bf16(x);
  return v;
}

}  // namespace pipetrain::gpu_test
