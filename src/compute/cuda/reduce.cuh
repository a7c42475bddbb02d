// Reductions shared by the kernels, each in a fixed order for a given shape. No kernel of the GPU
// build adds floats with atomics (the embedding gradient sums each row's positions in position
// order, attention's backward gives every output one block), so a step gives the same bits every
// time it runs, and a resumed run continues the same trajectory.
#pragma once
#include <cfloat>
#include <vector>

#include "check.cuh"
#include "launch.cuh"
#include "pipetrain/compute/gpu.hpp"

namespace pipetrain::gpu {

// The sum of n per-row values on the device (a loss per row, in double as the CPU keeps them),
// added in row order on the host, as the CPU adds its rows.
inline double sum_rows_in_order(const double* row_values, int n) {
  if (n == 0) return 0.0;
  std::vector<double> host(n);
  copy_to_host(host.data(), row_values, sizeof(double) * n);
  double sum = 0.0;
  for (double v : host) sum += v;
  return sum;
}

template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Whole-block sum / max (every thread gets the result); blockDim.x a multiple of 32, all threads call.
template <class T>
__device__ inline T block_sum(T v, T* shared32) {
  v = warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // shared32 may still be read from an earlier call
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < warps; ++w) total += shared32[w];
  return total;
}
__device__ inline float block_max(float v, float* shared32) {
  v = warp_max(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float m = -FLT_MAX;
  for (int w = 0; w < warps; ++w) m = fmaxf(m, shared32[w]);
  return m;
}

constexpr int kColumnRows = 256;  // rows per partial sum of column_sum_add

// partial[rb * C + c] = sum over rows [rb * kColumnRows, ...) of f(r, c); 32 x 8 threads per block.
template <class F>
__global__ void column_partials(float* partial, int N, int C, F f) {
  __shared__ float sh[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x, rb = blockIdx.y;
  const int r0 = rb * kColumnRows, r1 = min(N, r0 + kColumnRows);
  float acc = 0.f;
  if (c < C)
    for (int r = r0 + threadIdx.y; r < r1; r += 8) acc += f(r, c);
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.f;
    for (int y = 0; y < 8; ++y) s += sh[y][threadIdx.x];
    partial[static_cast<size_t>(rb) * C + c] = s;
  }
}
static __global__ void column_finish(float* out, const float* partial, int row_blocks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.f;
  for (int rb = 0; rb < row_blocks; ++rb) s += partial[static_cast<size_t>(rb) * C + c];
  out[c] += s;
}

struct Element {  // x[r, c] of a row-major [N, C] array
  const float* x;
  int C;
  __device__ float operator()(int r, int c) const { return x[static_cast<size_t>(r) * C + c]; }
};

// out[c] += sum over r < N of f(r, c), using scratch `slot`.
template <class F>
void column_sum_add(float* out, int N, int C, F f, int slot) {
  const int row_blocks = (N + kColumnRows - 1) / kColumnRows;
  if (row_blocks == 0) return;  // no rows: nothing to add
  float* partial = static_cast<float*>(scratch(slot, sizeof(float) * static_cast<size_t>(row_blocks) * C));
  PT_LAUNCH(column_partials<F>, dim3((C + 31) / 32, row_blocks), dim3(32, 8), 0, partial, N, C, f);
  PT_LAUNCH(column_finish, blocks_for(C), 256, 0, out, partial, row_blocks, C);
}

}  // namespace pipetrain::gpu
