// The softmaxes' exp and the GELU's tanh as branch-free polynomials, inline so that the loops
// calling them vectorise (out of line, every element was a function call).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace pipetrain {

// tanh as a 13/6 rational function on [-7.9, 7.9] (beyond, tanh is +-1 in float): within a few
// float ulps of std::tanh, branch-free so the GELU loops vectorise. A profile of the small config
// had libm's tanhf/expm1f at a quarter of the step.
inline float fast_tanh(float x) {
  x = std::min(7.90531110763549805f, std::max(-7.90531110763549805f, x));
  const float x2 = x * x;
  float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = x2 * p + -8.60467152213735e-11f;
  p = x2 * p + 5.12229709037114e-08f;
  p = x2 * p + 1.48572235717979e-05f;
  p = x2 * p + 6.37261928875436e-04f;
  p = x2 * p + 4.89352455891786e-03f;
  p = x * p;
  float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = x2 * q + 2.26843463243900e-03f;
  q = x2 * q + 4.89352518554385e-03f;
  return p / q;
}

// exp as 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p a degree-6 polynomial (Cephes expf):
// within 2 float ulps of std::exp, branch-free so the softmax loops vectorise. Inputs below -87.3
// give ~1e-38 instead of a denormal, which no softmax sum can notice.
inline float fast_exp(float x) {
  x = x > 88.3762626647949f ? 88.3762626647949f : (x < -87.3365447504f ? -87.3365447504f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 split in two for exactness
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace pipetrain
