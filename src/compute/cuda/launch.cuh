// Every kernel launch of the GPU build goes through PT_LAUNCH: on the rank's stream, checked, and a
// no-op when there is no work. CUDA rejects a grid with 0 blocks, while empty work is legitimate:
// ZeRO-1 gives a replica an empty slab of a tensor with fewer rows than replicas, and a tensor
// rank may hold no token of a micro-batch's vocabulary.
#pragma once
#include <utility>

#include "check.cuh"

namespace pipetrain::gpu {

// Blocks of `threads` covering n items (0 for none).
inline unsigned blocks_for(size_t n, unsigned threads = 256) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

template <class... Params, class... Args>
void launch(const char* file, int line, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
            Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  kernel<<<grid, block, shared_bytes, stream()>>>(std::forward<Args>(args)...);
  check_launch(file, line);
}

}  // namespace pipetrain::gpu

// PT_LAUNCH(kernel, grid, block, shared bytes, arguments...): names this line in a launch error.
#define PT_LAUNCH(kernel, grid, block, shared_bytes, ...) \
  ::pipetrain::gpu::launch(__FILE__, __LINE__, kernel, grid, block, shared_bytes, __VA_ARGS__)
