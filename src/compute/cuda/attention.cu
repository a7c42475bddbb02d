// Causal self-attention, one thread block per query row (forward) or key column of a key/value
// head (backward), the row's scores in shared memory. Query head h reads key/value head
// h / (NH / NKV) (grouped-query attention; NKV = NH is multi-head). Straightforward rather than fast: a fused
// flash-style kernel is the next step; this one fixes the numbers it must reproduce.
#include "pipetrain/compute/gpu_kernels.hpp"
#include "reduce.cuh"

namespace pipetrain::gpu {
namespace {

constexpr int kThreads = 128;

struct Heads {  // where query head h's q and its key/value head's k, v of token (b, t) sit in qkv [B, T, C + 2 KV]
  int T, C, hs, NH, NKV;
  __device__ int kv_head(int h) const { return h / (NH / NKV); }
  __device__ size_t row(int b, int t) const { return (static_cast<size_t>(b) * T + t) * (C + 2 * NKV * hs); }
  __device__ size_t q(int b, int t, int h) const { return row(b, t) + h * hs; }
  __device__ size_t k(int b, int t, int h) const { return row(b, t) + C + kv_head(h) * hs; }
  __device__ size_t v(int b, int t, int h) const { return row(b, t) + C + NKV * hs + kv_head(h) * hs; }
};

// Block (b, h, t): p = softmax(scale q_t . k_u for u <= t), att row = p (0 above the diagonal),
// out_t = sum_u p_u v_u.
__global__ void attention_forward_k(float* out, float* att, const float* qkv, int T, int C, int NH, int NKV,
                                    float scale) {
  extern __shared__ float p[];
  __shared__ float shared32[32];
  const int t = blockIdx.x % T, bh = blockIdx.x / T, h = bh % NH, b = bh / NH;
  const Heads H{T, C, C / NH, NH, NKV};
  const float* q = qkv + H.q(b, t, h);
  float mx = -FLT_MAX;
  for (int u = threadIdx.x; u <= t; u += blockDim.x) {
    const float* k = qkv + H.k(b, u, h);
    float s = 0.f;
    for (int i = 0; i < H.hs; ++i) s += q[i] * k[i];
    p[u] = s * scale;
    mx = fmaxf(mx, p[u]);
  }
  mx = block_max(mx, shared32);
  float sum = 0.f;
  for (int u = threadIdx.x; u <= t; u += blockDim.x) sum += (p[u] = expf(p[u] - mx));
  const float inv = 1.f / block_sum(sum, shared32);
  float* row = att + (static_cast<size_t>(bh) * T + t) * T;
  for (int u = threadIdx.x; u < T; u += blockDim.x) {
    const float a = u <= t ? p[u] * inv : 0.f;
    row[u] = a;
    if (u <= t) p[u] = a;
  }
  __syncthreads();
  float* o = out + (static_cast<size_t>(b) * T + t) * C + h * H.hs;
  for (int i = threadIdx.x; i < H.hs; i += blockDim.x) {
    float acc = 0.f;
    for (int u = 0; u <= t; ++u) acc += p[u] * qkv[H.v(b, u, h) + i];
    o[i] = acc;
  }
}

// Block (b, h, t): datt_u = dout_t . v_u, dpre_u = a_u (datt_u - sum_w a_w datt_w) (kept in
// `dpre` for the key pass), dq_t = scale sum_u dpre_u k_u.
__global__ void attention_backward_query_k(float* dqkv, float* dpre, const float* dout, const float* qkv,
                                           const float* att, int T, int C, int NH, int NKV, float scale) {
  extern __shared__ float d[];
  __shared__ float shared32[32];
  const int t = blockIdx.x % T, bh = blockIdx.x / T, h = bh % NH, b = bh / NH;
  const Heads H{T, C, C / NH, NH, NKV};
  const float* g = dout + (static_cast<size_t>(b) * T + t) * C + h * H.hs;
  const float* a = att + (static_cast<size_t>(bh) * T + t) * T;
  float dot = 0.f;
  for (int u = threadIdx.x; u <= t; u += blockDim.x) {
    const float* v = qkv + H.v(b, u, h);
    float s = 0.f;
    for (int i = 0; i < H.hs; ++i) s += g[i] * v[i];
    d[u] = s;
    dot += a[u] * s;
  }
  dot = block_sum(dot, shared32);
  float* dp = dpre + (static_cast<size_t>(bh) * T + t) * T;
  for (int u = threadIdx.x; u <= t; u += blockDim.x) dp[u] = d[u] = a[u] * (d[u] - dot);
  __syncthreads();
  float* dq = dqkv + H.q(b, t, h);
  for (int i = threadIdx.x; i < H.hs; i += blockDim.x) {
    float acc = 0.f;
    for (int u = 0; u <= t; ++u) acc += d[u] * qkv[H.k(b, u, h) + i];
    dq[i] = scale * acc;
  }
}

// Block (b, g, u) for key/value head g: dk_u = scale sum over its query heads h and t >= u of
// dpre[h, t, u] q_t, dv_u = sum over them of att[h, t, u] dout_t (heads in order: fixed bits).
__global__ void attention_backward_key_k(float* dqkv, const float* dpre, const float* dout, const float* qkv,
                                         const float* att, int T, int C, int NH, int NKV, float scale) {
  const int u = blockIdx.x % T, bg = blockIdx.x / T, g = bg % NKV, b = bg / NKV, group = NH / NKV;
  const Heads H{T, C, C / NH, NH, NKV};
  float* dk = dqkv + H.k(b, u, g * group);
  float* dv = dqkv + H.v(b, u, g * group);
  for (int i = threadIdx.x; i < H.hs; i += blockDim.x) {
    float k_acc = 0.f, v_acc = 0.f;
    for (int h = g * group; h < (g + 1) * group; ++h)
      for (int t = u; t < T; ++t) {
        const size_t at = ((static_cast<size_t>(b) * NH + h) * T + t) * T + u;
        k_acc += dpre[at] * qkv[H.q(b, t, h) + i];
        v_acc += att[at] * dout[(static_cast<size_t>(b) * T + t) * C + h * H.hs + i];
      }
    dk[i] = scale * k_acc;
    dv[i] = v_acc;
  }
}

// The row in dynamic shared memory plus the 32-float static shared32 must fit the 48 KiB a block
// gets without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize).
void check_row_fits(int T) {
  if ((static_cast<size_t>(T) + 32) * sizeof(float) > 48 * 1024)
    throw std::runtime_error("GPU attention: seq_len " + std::to_string(T) + " exceeds this kernel's 12256 tokens");
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, int NKV) {
  check_row_fits(T);
  const float scale = 1.f / sqrtf(static_cast<float>(C / NH));
  attention_forward_k<<<B * NH * T, kThreads, sizeof(float) * T, stream()>>>(out, att, qkv, T, C, NH, NKV, scale);
  PT_LAUNCHED();
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH,
                        int NKV) {
  check_row_fits(T);
  const float scale = 1.f / sqrtf(static_cast<float>(C / NH));
  float* dpre = static_cast<float*>(scratch(5, sizeof(float) * static_cast<size_t>(B) * NH * T * T));
  attention_backward_query_k<<<B * NH * T, kThreads, sizeof(float) * T, stream()>>>(dqkv, dpre, dout, qkv, att, T, C,
                                                                                    NH, NKV, scale);
  PT_LAUNCHED();
  attention_backward_key_k<<<B * NKV * T, kThreads, 0, stream()>>>(dqkv, dpre, dout, qkv, att, T, C, NH, NKV, scale);
  PT_LAUNCHED();
}

}  // namespace pipetrain::gpu
