// The mixture of experts' kernels on the GPU (moe_kernels.hpp has the contract; moe_kernels.cpp is
// the CPU twin). The routing itself runs on the host (its row counts size the grouped products and
// the all-to-alls, so they must reach the host anyway); these move, weigh and sum the rows by the
// routing's device copy (RoutedSlots). A token's slots are added in slot order, as on the CPU;
// the sums over a row (the softmax's, the dot products') run across a warp's lanes, so they match
// the CPU's to rounding, not to the bit, but in a fixed order: no atomics, the same bits every run.
#include <cfloat>
#include <cmath>

#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "reduce.cuh"

namespace pipetrain::gpu {
namespace {

constexpr unsigned kWarpRowsThreads = 256;  // 8 rows a block, one warp each

inline unsigned warp_row_blocks(size_t rows) { return blocks_for(rows * 32, kWarpRowsThreads); }

// One warp per token: the softmax over its E logits, in double as the CPU adds them.
__global__ void router_softmax_k(float* probs, float* lse, const float* logits, int N, int E) {
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (t >= N) return;
  const float* x = logits + static_cast<size_t>(t) * E;
  float mx = -FLT_MAX;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, x[e]);
  mx = warp_max(mx);
  double sum = 0;
  for (int e = lane; e < E; e += 32) sum += exp(static_cast<double>(x[e]) - mx);
  const double log_sum = log(warp_sum(sum));
  float* p = probs + static_cast<size_t>(t) * E;  // may be x: each lane writes only what it read
  for (int e = lane; e < E; e += 32) p[e] = static_cast<float>(exp(static_cast<double>(x[e]) - mx - log_sum));
  if (lane == 0) lse[t] = static_cast<float>(mx + log_sum);
}

// One warp per token: dp_e = the load-balancing term (E f_e / N per token) plus the token's slots'
// weight gradients through the renormalisation, then the softmax's backward and the z-loss's.
__global__ void router_backward_k(float* dlogits, const float* dweight, const float* probs, const float* lse,
                                  RoutedSlots r, bool norm_topk, float aux_scale, float z_per_token) {
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (t >= r.N) return;
  const int E = r.E, k = r.k;
  const float* p = probs + static_cast<size_t>(t) * E;
  const float* dw = dweight ? dweight + static_cast<size_t>(t) * k : nullptr;
  const float* w = r.weight + static_cast<size_t>(t) * k;
  const int* ex = r.expert + static_cast<size_t>(t) * k;
  float sum = 0, dot = 0;  // sum_s p_s and sum_s dw_s w_s, every lane alike
  if (dw)
    for (int s = 0; s < k; ++s) {
      sum += p[ex[s]];
      dot += dw[s] * w[s];
    }
  auto dp = [&](int e) {
    float d = aux_scale * E * (static_cast<float>(r.chosen[e]) / r.N) / r.N;
    if (dw)
      for (int s = 0; s < k; ++s)
        if (ex[s] == e) d += norm_topk ? (dw[s] - dot) / sum : dw[s];
    return d;
  };
  float pdp = 0;
  for (int e = lane; e < E; e += 32) pdp += p[e] * dp(e);
  pdp = warp_sum(pdp);
  const float z = z_per_token * lse[t];
  float* dl = dlogits + static_cast<size_t>(t) * E;
  for (int e = lane; e < E; e += 32) dl[e] = p[e] * (dp(e) - pdp) + z * p[e];
}

__global__ void gather_k(float* xs, const float* x, RoutedSlots r, int C, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  xs[i] = x[static_cast<size_t>(r.token[i / C]) * C + i % C];
}

// One thread per token and column: its kept slots in slot order.
__global__ void combine_forward_k(float* out, const float* y, RoutedSlots r, int C, bool accumulate, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t t = i / C, c = i % C;
  float o = accumulate ? out[i] : 0.f;
  for (int s = 0; s < r.k; ++s) {
    const int row = r.row[t * r.k + s];
    if (row >= 0) o += r.weight[t * r.k + s] * y[static_cast<size_t>(row) * C + c];
  }
  out[i] = o;
}

__global__ void scatter_add_k(float* dx, const float* dxs, RoutedSlots r, int C, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t t = i / C, c = i % C;
  float o = dx[i];
  for (int s = 0; s < r.k; ++s) {
    const int row = r.row[t * r.k + s];
    if (row >= 0) o += dxs[static_cast<size_t>(row) * C + c];
  }
  dx[i] = o;
}

// One thread per slot and column: a kept slot's row gets its weight times its token's gradient.
__global__ void combine_rows_backward_k(float* dy, const float* dout, RoutedSlots r, int C, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t slot = i / C, c = i % C;
  const int row = r.row[slot];
  if (row >= 0) dy[static_cast<size_t>(row) * C + c] = r.weight[slot] * dout[slot / r.k * C + c];
}

// One warp per slot: dout[token] . y[row], 0 where dropped.
__global__ void combine_weights_backward_k(float* dweight, const float* dout, const float* y, RoutedSlots r, int C) {
  const size_t slot = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (slot >= static_cast<size_t>(r.N) * r.k) return;
  const int row = r.row[slot];
  float dot = 0;
  if (row >= 0) {
    const float *d = dout + slot / r.k * C, *yr = y + static_cast<size_t>(row) * C;
    for (int c = lane; c < C; c += 32) dot += d[c] * yr[c];
  }
  dot = warp_sum(dot);
  if (lane == 0) dweight[slot] = dot;
}

__device__ inline float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void sigmoid_k(float* gate, int N) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < N) gate[t] = sigmoid(gate[t]);
}

__global__ void scale_rows_k(float* out, const float* scale, const float* in, int C, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = scale[i / C] * in[i];
}

// One warp per token: dout[t] . shared[t], in double as the CPU adds it.
__global__ void row_dots_k(float* dot, const float* a, const float* b, int N, int C) {
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (t >= N) return;
  const float *x = a + static_cast<size_t>(t) * C, *y = b + static_cast<size_t>(t) * C;
  double s = 0;
  for (int c = lane; c < C; c += 32) s += static_cast<double>(x[c]) * y[c];
  s = warp_sum(s);
  if (lane == 0) dot[t] = static_cast<float>(s);
}

__global__ void sigmoid_backward_k(float* dlogit, const float* dgate, const float* gate, int N) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < N) dlogit[t] = dgate[t] * gate[t] * (1.f - gate[t]);
}

}  // namespace

void router_softmax_forward(float* probs, float* lse, const float* logits, int N, int E) {
  PT_LAUNCH(router_softmax_k, warp_row_blocks(N), kWarpRowsThreads, 0, probs, lse, logits, N, E);
}

void router_backward(float* dlogits, const float* dweight, const float* probs, const float* lse, const RoutedSlots& r,
                     bool norm_topk, float aux_scale, float z_scale) {
  PT_LAUNCH(router_backward_k, warp_row_blocks(r.N), kWarpRowsThreads, 0, dlogits, dweight, probs, lse, r, norm_topk,
            aux_scale, 2.f * z_scale / r.N);
}

void moe_gather(float* xs, const float* x, const RoutedSlots& r, int C) {
  const size_t n = static_cast<size_t>(r.rows) * C;
  PT_LAUNCH(gather_k, blocks_for(n), 256, 0, xs, x, r, C, n);
}

void moe_combine_forward(float* out, const float* y, const RoutedSlots& r, int C, bool accumulate) {
  const size_t n = static_cast<size_t>(r.N) * C;
  PT_LAUNCH(combine_forward_k, blocks_for(n), 256, 0, out, y, r, C, accumulate, n);
}

void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y, const RoutedSlots& r, int C) {
  const size_t slots = static_cast<size_t>(r.N) * r.k;
  if (dy) PT_LAUNCH(combine_rows_backward_k, blocks_for(slots * C), 256, 0, dy, dout, r, C, slots * C);
  if (dweight)
    PT_LAUNCH(combine_weights_backward_k, warp_row_blocks(slots), kWarpRowsThreads, 0, dweight, dout, y, r, C);
}

void moe_scatter_add(float* dx, const float* dxs, const RoutedSlots& r, int C) {
  const size_t n = static_cast<size_t>(r.N) * C;
  PT_LAUNCH(scatter_add_k, blocks_for(n), 256, 0, dx, dxs, r, C, n);
}

void shared_gate_forward(float* out, float* gate, const float* shared, int N, int C) {
  PT_LAUNCH(sigmoid_k, blocks_for(N), 256, 0, gate, N);
  const size_t n = static_cast<size_t>(N) * C;
  PT_LAUNCH(scale_rows_k, blocks_for(n), 256, 0, out, gate, shared, C, n);
}

void shared_gate_backward(float* dshared, float* dgate, const float* dout, const float* shared, const float* gate,
                          int N, int C) {
  const size_t n = static_cast<size_t>(N) * C;
  PT_LAUNCH(scale_rows_k, blocks_for(n), 256, 0, dshared, gate, dout, C, n);
  if (dgate) PT_LAUNCH(row_dots_k, warp_row_blocks(N), kWarpRowsThreads, 0, dgate, dout, shared, N, C);
}

void sigmoid_backward(float* dlogit, const float* dgate, const float* gate, int N) {
  PT_LAUNCH(sigmoid_backward_k, blocks_for(N), 256, 0, dlogit, dgate, gate, N);
}

}  // namespace pipetrain::gpu
