#include "pipetrain/data/index_permutation.hpp"

#include "pipetrain/util/rng.hpp"

namespace pipetrain {
namespace {

constexpr int kRounds = 6;  // enough mixing for a data order; each round is one splitmix64 step

uint64_t feistel(uint64_t x, int half_bits, uint64_t key) {
  const uint64_t mask = (uint64_t{1} << half_bits) - 1;
  uint64_t left = x >> half_bits, right = x & mask;
  for (int r = 0; r < kRounds; ++r) {
    SplitMix64 f{key ^ (right * 0x9e3779b97f4a7c15ULL) ^ (static_cast<uint64_t>(r) << 56)};
    const uint64_t next = left ^ (f.next() & mask);
    left = right;
    right = next;
  }
  return (left << half_bits) | right;
}

}  // namespace

uint64_t permute_index(uint64_t i, uint64_t n, uint64_t key) {
  int half_bits = 1;
  while (half_bits < 32 && (uint64_t{1} << (2 * half_bits)) < n) ++half_bits;
  uint64_t x = i;
  do x = feistel(x, half_bits, key);
  while (x >= n);
  return x;
}

}  // namespace pipetrain
