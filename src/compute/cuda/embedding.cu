// The token and position embeddings on the GPU (layer_kernels.hpp has the contract, kernels.cpp the
// CPU twin). The token-embedding gradient adds without atomics: the micro-batch's positions are
// sorted by vocabulary row with a stable radix sort (a row's positions keep their order), then each
// row adds its positions' gradients in position order. That is the CPU's order, so the GPU gives
// the CPU's bits, the same on every run, where a scatter with atomicAdd would not. Positions given
// per row (restarting per document) add to the position table the same way, sorted by position.
#include <cub/device/device_radix_sort.cuh>

#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "reduce.cuh"

namespace pipetrain::gpu {
namespace {

constexpr int kEmbeddingSlot = 5;  // scratch for the sort (keys, positions, CUB's own storage)

__global__ void encoder_forward_k(float* out, const int* tokens, const float* wte, const float* wpe, const int* pos,
                                  int T, int C, int v_begin, int v_rows, size_t total) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const size_t n = i / C;
  const int c = static_cast<int>(i % C), t = pos ? pos[n] : static_cast<int>(n % T), row = tokens[n] - v_begin;
  const float e = row >= 0 && row < v_rows ? wte[static_cast<size_t>(row) * C + c] : 0.f;
  out[i] = e + (wpe ? wpe[static_cast<size_t>(t) * C + c] : 0.f);
}

// key[n]: position n's row of this rank's vocabulary, or v_rows (sorting after every row) for a
// token another tensor rank holds; pos[n] = n.
__global__ void row_keys_k(int* key, int* pos, const int* tokens, int v_begin, int v_rows, int positions) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= positions) return;
  const int row = tokens[n] - v_begin;
  key[n] = row >= 0 && row < v_rows ? row : v_rows;
  pos[n] = n;
}

// Block (i, column tile): where sorted entry i begins its row's run, that row's columns of the tile
// gain the run's positions' gradients, one after another in position order.
__global__ void wte_rows_k(float* dwte, const float* dout, const int* row_of, const int* pos, int positions, int C,
                           int v_rows) {
  const int i = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x, row = row_of[i];
  if (row == v_rows || (i > 0 && row_of[i - 1] == row) || c >= C) return;
  float* d = dwte + static_cast<size_t>(row) * C + c;
  float acc = *d;
  for (int k = i; k < positions && row_of[k] == row; ++k) acc += dout[static_cast<size_t>(pos[k]) * C + c];
  *d = acc;
}

// dwpe[t, c] gains dout[b, t, c] for b in order, as on the CPU.
__global__ void wpe_k(float* dwpe, const float* dout, int B, size_t TC) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // t * C + c
  if (i >= TC) return;
  float acc = dwpe[i];
  for (int b = 0; b < B; ++b) acc += dout[b * TC + i];
  dwpe[i] = acc;
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

void token_rows_backward(float* dwte, const float* dout, const int* tokens, int positions, int C, int v_begin,
                         int v_rows) {
  int bits = 1;  // enough for keys 0 .. v_rows
  while ((v_rows >> bits) > 0) ++bits;
  size_t temp_bytes = 0;
  PT_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int*>(nullptr),
                                          static_cast<int*>(nullptr), static_cast<const int*>(nullptr),
                                          static_cast<int*>(nullptr), positions, 0, bits, stream()));
  const size_t ints = aligned(sizeof(int) * static_cast<size_t>(positions));
  char* base = static_cast<char*>(scratch(kEmbeddingSlot, 4 * ints + temp_bytes));
  int *key = reinterpret_cast<int*>(base), *sorted_key = reinterpret_cast<int*>(base + ints);
  int *pos = reinterpret_cast<int*>(base + 2 * ints), *sorted_pos = reinterpret_cast<int*>(base + 3 * ints);
  PT_LAUNCH(row_keys_k, blocks_for(positions), 256, 0, key, pos, tokens, v_begin, v_rows, positions);
  PT_CUDA(cub::DeviceRadixSort::SortPairs(base + 4 * ints, temp_bytes, key, sorted_key, pos, sorted_pos, positions, 0,
                                          bits, stream()));
  PT_LAUNCH(wte_rows_k, dim3(positions, blocks_for(C)), 256, 0, dwte, dout, sorted_key, sorted_pos, positions, C,
            v_rows);
}

}  // namespace

void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C,
                     int v_begin, int v_rows, const int* pos) {
  const size_t total = static_cast<size_t>(B) * T * C;
  PT_LAUNCH(encoder_forward_k, blocks_for(total), 256, 0, out, tokens, wte, wpe, pos, T, C, v_begin, v_rows, total);
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C, int v_begin,
                      int v_rows, const int* pos) {
  if (static_cast<size_t>(B) * T * C == 0) return;  // no positions or no columns: nothing to add
  token_rows_backward(dwte, dout, tokens, B * T, C, v_begin, v_rows);
  if (!dwpe) return;                                                     // no position table (llama)
  if (pos) return token_rows_backward(dwpe, dout, pos, B * T, C, 0, T);  // positions as rows of the table
  const size_t TC = static_cast<size_t>(T) * C;
  PT_LAUNCH(wpe_k, blocks_for(TC), 256, 0, dwpe, dout, B, TC);
}

}  // namespace pipetrain::gpu
