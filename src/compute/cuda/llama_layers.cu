// The llama family's kernels on the GPU (gpu_kernels.hpp; the CPU twins in llama_kernels.cpp):
// RMSNorm, rotary position embeddings and SwiGLU.
#include <cmath>

#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "reduce.cuh"

namespace pipetrain::gpu {
namespace {

// One warp per row.
__global__ void rmsnorm_forward_k(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                                  float eps) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float sq = 0.f;
  for (int c = lane; c < C; c += 32) sq += x[c] * x[c];
  const float r = 1.f / sqrtf(warp_sum(sq) / C + eps);
  float* o = out + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += 32) o[c] = x[c] * r * weight[c];
  if (lane == 0) rstd[row] = r;
}
__global__ void rmsnorm_backward_input_k(float* dinp, const float* dout, const float* inp, const float* weight,
                                         const float* rstd, int N, int C) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t off = static_cast<size_t>(row) * C;
  const float s = rstd[row];
  float dn_norm = 0.f;
  for (int c = lane; c < C; c += 32) dn_norm += weight[c] * dout[off + c] * inp[off + c] * s;
  dn_norm = warp_sum(dn_norm) / C;
  for (int c = lane; c < C; c += 32) dinp[off + c] += s * (weight[c] * dout[off + c] - inp[off + c] * s * dn_norm);
}
struct RmsNormWeightGrad {  // dout * normalised input
  const float *dout, *inp, *rstd;
  int C;
  __device__ float operator()(int r, int c) const {
    const size_t i = static_cast<size_t>(r) * C + c;
    return dout[i] * inp[i] * rstd[r];
  }
};

// One thread per (row, head of q and k, pair i): pair (i, i + hs/2) turned by (pos0 + t)
// theta^(-2i/hs), or back (sign -1).
__global__ void rope_k(float* qkv, int T, int C3, int heads, int hs, float theta, int pos0, const int* pos, float sign,
                       size_t n) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (idx >= n) return;
  const int half = hs / 2, i = static_cast<int>(idx % half), h = static_cast<int>(idx / half % heads);
  const size_t row = idx / half / heads;
  const int p = pos ? pos[row] : pos0 + static_cast<int>(row % T);
  const double angle = p * pow(static_cast<double>(theta), -2.0 * i / hs);
  const float c = static_cast<float>(cos(angle)), s = sign * static_cast<float>(sin(angle));
  float* x = qkv + row * C3 + static_cast<size_t>(h) * hs;
  const float a = x[i], b = x[i + half];
  x[i] = a * c - b * s;
  x[i + half] = b * c + a * s;
}

__device__ inline float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void swiglu_forward_k(float* out, const float* gate_up, int H, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t row = i / H, j = i % H;
  const float g = gate_up[row * 2 * H + j], u = gate_up[row * 2 * H + H + j];
  out[i] = g * sigmoid(g) * u;
}
__global__ void swiglu_backward_k(float* dgate_up, const float* gate_up, const float* dout, int H, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t row = i / H, j = i % H;
  const float g = gate_up[row * 2 * H + j], u = gate_up[row * 2 * H + H + j], s = sigmoid(g);
  dgate_up[row * 2 * H + j] = dout[i] * u * s * (1.f + g * (1.f - s));
  dgate_up[row * 2 * H + H + j] = dout[i] * g * s;
}

void rotate(float* qkv, int B, int T, int C, int NH, int NKV, float theta, int pos0, const int* pos, float sign) {
  const int hs = C / NH, heads = NH + NKV, C3 = C + 2 * NKV * hs;
  const size_t n = static_cast<size_t>(B) * T * heads * (hs / 2);
  PT_LAUNCH(rope_k, blocks_for(n), 256, 0, qkv, T, C3, heads, hs, theta, pos0, pos, sign, n);
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  PT_LAUNCH(rmsnorm_forward_k, blocks_for(static_cast<size_t>(N) * 32), 256, 0, out, rstd, inp, weight, N, C, eps);
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  if (dweight) column_sum_add(dweight, N, C, RmsNormWeightGrad{dout, inp, rstd, C}, 0);
  if (dinp) {
    PT_LAUNCH(rmsnorm_backward_input_k, blocks_for(static_cast<size_t>(N) * 32), 256, 0, dinp, dout, inp, weight, rstd,
              N, C);
  }
}

void rope_forward(float* qkv, int B, int T, int C, int NH, int NKV, float theta, int pos0, const int* pos) {
  rotate(qkv, B, T, C, NH, NKV, theta, pos0, pos, 1.f);
}
void rope_backward(float* dqkv, int B, int T, int C, int NH, int NKV, float theta, int pos0, const int* pos) {
  rotate(dqkv, B, T, C, NH, NKV, theta, pos0, pos, -1.f);
}

void swiglu_forward(float* out, const float* gate_up, int N, int H) {
  const size_t n = static_cast<size_t>(N) * H;
  PT_LAUNCH(swiglu_forward_k, blocks_for(n), 256, 0, out, gate_up, H, n);
}
void swiglu_backward(float* dgate_up, const float* gate_up, const float* dout, int N, int H) {
  const size_t n = static_cast<size_t>(N) * H;
  PT_LAUNCH(swiglu_backward_k, blocks_for(n), 256, 0, dgate_up, gate_up, dout, H, n);
}

}  // namespace pipetrain::gpu
