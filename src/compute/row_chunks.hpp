// How the CPU kernels split rows among threads (kernels.cpp, llama_kernels.cpp).
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

#include "pipetrain/compute/parallel_for.hpp"

namespace pipetrain {

// About 16K floats of work per chunk: big enough that waking a thread pays, small enough to balance.
inline size_t rows_per_chunk(int C) { return std::max<size_t>(1, 16384 / static_cast<size_t>(C)); }
constexpr size_t kElementsPerChunk = 16384;

// Row-parallel reduction: fn(begin, end, partial) adds rows [begin, end) into its chunk's zeroed
// partial[width]; the partials are then added into out in chunk order, so the sums do not depend on
// the thread count.
template <class Fn>
void reduce_row_chunks(int N, size_t rows, size_t width, float* out, Fn fn) {
  const size_t chunks = chunk_count(N, rows);
  std::vector<float> partial(chunks * width, 0.f);
  parallel_for(N, rows, [&](size_t begin, size_t end) { fn(begin, end, partial.data() + begin / rows * width); });
  for (size_t c = 0; c < chunks; ++c)
    for (size_t j = 0; j < width; ++j) out[j] += partial[c * width + j];
}

}  // namespace pipetrain
