// splitmix64: a tiny seedable generator that draws the same numbers on every machine, for
// everything pipetrain draws (initial weights, the synthetic corpus, shuffling, sampling).
#pragma once
#include <cstdint>

namespace pipetrain {

// Order-free digests of what was drawn (which data windows a step read): sums of 48-bit hashes
// modulo 2^48, exact in a double, so partial sums from many ranks combine in any order.
inline constexpr uint64_t kDigestMask = (uint64_t{1} << 48) - 1;

struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(next() % n); }
  double uniform() { return (next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

}  // namespace pipetrain
