// A seeded shuffle of [0, n) computed index by index in constant memory, for data orders over
// corpora too large to hold a permutation of: a balanced Feistel network on the smallest even
// number of bits that covers n is a bijection on [0, 2^bits); walking it from i until the value
// falls inside [0, n) (cycle walking, under 4 steps on average) makes it one on [0, n).
#pragma once
#include <cstdint>

namespace pipetrain {

// The image of i (< n) under the permutation `key` selects; n >= 1.
uint64_t permute_index(uint64_t i, uint64_t n, uint64_t key);

}  // namespace pipetrain
