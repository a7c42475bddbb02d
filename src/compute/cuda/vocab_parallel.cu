// The loss over a vocabulary split among tensor ranks, on the GPU (layer_kernels.hpp has the
// contract; vocab_parallel_kernels.cpp is the CPU twin). One block per row.
#include <cfloat>
#include <cmath>
#include <vector>

#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "reduce.cuh"

namespace pipetrain::gpu {
namespace {

__global__ void vocab_softmax_max_k(float* row_max, const float* logits, int V) {
  __shared__ float shared32[32];
  const float* l = logits + static_cast<size_t>(blockIdx.x) * V;
  float mx = -FLT_MAX;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_max(mx, shared32);
  if (threadIdx.x == 0) row_max[blockIdx.x] = mx;
}

// The row's sum in double, as the contract keeps it and the CPU adds it.
__global__ void vocab_softmax_exp_k(float* probs, double* stats, const float* logits, const float* row_max,
                                    const int* targets, int N, int V, int v_begin) {
  __shared__ double shared32[32];
  const size_t off = static_cast<size_t>(blockIdx.x) * V;
  const float mx = row_max[blockIdx.x];
  double sum = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (probs[off + j] = expf(logits[off + j] - mx));
  sum = block_sum(sum, shared32);
  if (threadIdx.x != 0) return;
  const int t = targets[blockIdx.x] - v_begin;
  stats[blockIdx.x] = sum;
  stats[N + blockIdx.x] = t >= 0 && t < V ? logits[off + t] : 0.0;
}

__global__ void vocab_softmax_finish_k(float* probs, double* row_loss, const float* row_max, const double* stats, int N,
                                       int V) {
  const size_t off = static_cast<size_t>(blockIdx.x) * V;
  const float inv = static_cast<float>(1.0 / stats[blockIdx.x]);
  for (int j = threadIdx.x; j < V; j += blockDim.x) probs[off + j] *= inv;
  if (threadIdx.x == 0) row_loss[blockIdx.x] = log(stats[blockIdx.x]) + row_max[blockIdx.x] - stats[N + blockIdx.x];
}

}  // namespace

void vocab_softmax_max(float* row_max, const float* logits, int N, int V) {
  PT_LAUNCH(vocab_softmax_max_k, N, 256, 0, row_max, logits, V);
}

void vocab_softmax_exp(float* probs, double* stats, const float* logits, const float* row_max, const int* targets,
                       int N, int V, int v_begin) {
  PT_LAUNCH(vocab_softmax_exp_k, N, 256, 0, probs, stats, logits, row_max, targets, N, V, v_begin);
}

double vocab_softmax_finish(float* probs, const float* row_max, const double* stats, int N, int V) {
  double* row_loss = static_cast<double*>(scratch(0, sizeof(double) * N));
  PT_LAUNCH(vocab_softmax_finish_k, N, 256, 0, probs, row_loss, row_max, stats, N, V);
  return sum_rows_in_order(row_loss, N);
}

}  // namespace pipetrain::gpu
