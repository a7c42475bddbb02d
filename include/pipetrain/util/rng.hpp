// splitmix64: a tiny seedable generator that draws the same numbers on every machine, for
// everything pipetrain draws (initial weights, the synthetic corpus, shuffling, sampling).
#pragma once
#include <cstdint>

namespace pipetrain {

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
