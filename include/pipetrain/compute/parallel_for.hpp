#pragma once
// Splits the element-wise kernels over the cores a rank owns. The BLAS has its own threads for
// the matrix products; without this the rest of the step (GELU, LayerNorm, softmax, AdamW) ran on
// one core while the BLAS threads idled.
#include <cstddef>
#include <functional>

namespace pipetrain {

// Threads parallel_for uses, the caller included (1 = run inline; the default). Call it between
// steps, never from inside a parallel_for.
void set_parallel_threads(int threads);

// Runs body(begin, end) for the chunks [0, grain), [grain, 2 grain), ... of [0, n) and returns when
// all are done. The chunks depend only on n and grain, never on the thread count, so a reduction
// that keeps one partial per chunk and adds them in chunk order gives the same bits on any number
// of threads. Chunks must not write to the same memory.
void parallel_for(size_t n, size_t grain, const std::function<void(size_t begin, size_t end)>& body);

inline size_t chunk_count(size_t n, size_t grain) { return (n + grain - 1) / grain; }

}  // namespace pipetrain
