// The 16-bit float formats model files use, to and from fp32: bfloat16 (fp32's exponent, 7
// fraction bits; written by export, read by init_from) and IEEE half (read only).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "pipetrain/util/bfloat16.hpp"  // bf16_from_float, float_from_bf16

namespace pipetrain {

// Model files are little-endian; their tensors are copied to and from memory as they are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "model file I/O assumes a little-endian host");

inline float float_from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, frac = h & 0x3ffu;
  if (exp == 0x1f) return float_of_bits(sign | 0x7f800000u | (frac << 13));  // inf, NaN
  if (exp != 0) return float_of_bits(sign | ((exp + 112) << 23) | (frac << 13));
  // zero and subnormals: frac x 2^-24, exact in fp32
  const float v = static_cast<float>(frac) * 0x1p-24f;
  return sign ? -v : v;
}

// How a file stores its floats. Reading takes all three; export writes f32 or bf16.
enum class StoredFloat { f32, bf16, f16 };
inline size_t stored_bytes(StoredFloat t) { return t == StoredFloat::f32 ? 4 : 2; }
inline const char* dtype_name(StoredFloat t) {
  return t == StoredFloat::f32 ? "fp32" : t == StoredFloat::bf16 ? "bf16" : "fp16";
}

// n values from their stored bytes (little-endian) to fp32.
inline void decode_floats(const unsigned char* in, size_t n, StoredFloat t, float* out) {
  if (t == StoredFloat::f32) {
    std::memcpy(out, in, 4 * n);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = t == StoredFloat::bf16 ? float_from_bf16(h) : float_from_f16(h);
  }
}

// n fp32 values to their stored bytes: as they are (f32) or rounded to bf16 (f16 is not written).
inline void encode_floats(const float* in, size_t n, StoredFloat t, unsigned char* out) {
  if (t == StoredFloat::f32) {
    std::memcpy(out, in, 4 * n);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = bf16_from_float(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

}  // namespace pipetrain
