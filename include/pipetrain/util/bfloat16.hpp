// bfloat16 (fp32's sign and exponent, 7 fraction bits) to and from fp32: what model files store
// (interop's float formats) and what a bf16 run's matrix products take (compute/precision.hpp).
#pragma once
#include <cstdint>
#include <cstring>

namespace pipetrain {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even (what PyTorch's .to(torch.bfloat16) does): add half an ulp of the
// kept part, minus one when the kept part is already even, and truncate. NaN stays a (quiet) NaN;
// values beyond bf16's largest round to infinity as IEEE rounding says.
inline uint16_t bf16_from_float(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float float_from_bf16(uint16_t h) { return float_of_bits(static_cast<uint32_t>(h) << 16); }

}  // namespace pipetrain
