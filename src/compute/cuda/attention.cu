// Causal self-attention without the T x T matrix (flash attention), fp32 throughout; the contract
// is layer_kernels.hpp's. Rows of queries and keys go in tiles of kTile through shared memory.
//
// Forward: a block per (batch, head, query tile) walks the key tiles up to its diagonal with an
// online softmax: each row keeps its running max m and sum l of exp(score - m), and its output
// accumulator is rescaled whenever m grows; at the end out = acc / l and lse = m + log l.
//
// Backward (as FlashAttention-2), from lse and D_t = dout_t . out_t (a first pass, O(T) per head):
// with p = exp(score - lse) recomputed tile by tile and dS = p (dout . v - D),
//   - a block per (batch, key/value head, key tile) sums dv = p^T dout and dk = scale dS^T q over
//     the query heads of its group in head order, each over the query tiles at or after its keys in
//     order;
//   - a block per (batch, head, query tile) sums dq = scale dS k over the key tiles in order.
// Every output has one block that sums it in a fixed order: no atomics, the same bits every run.
// Query head h reads key/value head h / (NH / NKV) in place (grouped-query attention, no copies).
// Memory beyond the inputs and outputs: D, [B, NH, T] floats. Any T; head sizes up to 256.
// A document mask (doc_start) also masks a row's keys before its document's start; the key tiles
// wholly before a query tile's first row's start are skipped, and a key tile's dk and dv stop at
// the first query tile whose rows all start after it.
//
// Speed: a thread of a tile row computes 4 scores of it and owns 4-column chunks of its outputs;
// shared memory is read 4 floats at a time (float4), 5 reads per 16 multiply-adds in the scores.
#include <cmath>
#include <string>

#include "pipetrain/compute/gpu_kernels.hpp"
#include "reduce.cuh"

namespace pipetrain::gpu {
namespace {

constexpr int kTile = 32;                 // query rows and key rows per tile
constexpr int kThreads = 256;             // a block's threads: kLanes per row of a tile
constexpr int kLanes = kThreads / kTile;  // 8, consecutive lanes of one warp
constexpr int kScores = kTile / kLanes;   // 4 scores of its row per thread: columns lane + kLanes c
constexpr int kMaxHeadSize = 256;
constexpr int kDSlot = 6;  // scratch for D

struct Heads {  // where rows of a (batch, head) sit: qkv [B, T, C + 2 KV], out and dout [B, T, C], lse [B, NH, T]
  int T, C, hs, NH, NKV;
  const int* doc_start;  // [B, T] or null
  // The first key row t of sequence b sees (t < T).
  __device__ int first_key(int b, int t) const { return doc_start ? doc_start[static_cast<size_t>(b) * T + t] : 0; }
  __device__ int C3() const { return C + 2 * NKV * hs; }
  __device__ int kv_head(int h) const { return h / (NH / NKV); }
  __device__ size_t row(int b, int t) const { return (static_cast<size_t>(b) * T + t) * C3(); }
  __device__ size_t q(int b, int t, int h) const { return row(b, t) + static_cast<size_t>(h) * hs; }
  __device__ size_t k(int b, int t, int g) const { return row(b, t) + C + static_cast<size_t>(g) * hs; }
  __device__ size_t v(int b, int t, int g) const { return row(b, t) + C + static_cast<size_t>(NKV + g) * hs; }
  __device__ size_t o(int b, int t, int h) const { return (static_cast<size_t>(b) * T + t) * C + h * hs; }
  __device__ size_t l(int b, int h, int t) const { return (static_cast<size_t>(b) * NH + h) * T + t; }
};

// A shared tile holds kTile rows of a head's hs values, zero-padded to a multiple of 4 (padded(hs))
// so they can be read as float4. Its row stride is 4 x an odd number: the 8 rows the lanes of a
// tile row read at once (float4 at the same column) then fall in 8 different groups of 4 banks.
__host__ __device__ inline int padded(int hs) { return (hs + 3) / 4 * 4; }
__host__ __device__ inline int row_stride(int hs) { return padded(hs) % 8 == 0 ? padded(hs) + 4 : padded(hs); }
constexpr int kScoreStride = kTile + 4;  // the score tile's: float4 rows

__device__ inline float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ inline void fma4(float4& acc, float a, const float4& b) {
  acc.x += a * b.x, acc.y += a * b.y, acc.z += a * b.z, acc.w += a * b.w;
}

// dst (kTile rows) = `rows` rows of src, `stride` apart, then zeros; columns hs.. padded(hs) zero.
__device__ void load_tile(float* dst, const float* src, size_t stride, int rows, int hs) {
  const int ld = row_stride(hs), width = padded(hs);
  for (int i = threadIdx.x; i < kTile * width; i += blockDim.x) {
    const int r = i / width, d = i % width;
    dst[r * ld + d] = r < rows && d < hs ? src[r * stride + d] : 0.f;
  }
}

// s[c] = a_r . b_(lane + kLanes c) for this thread's row r of a and its 4 rows of b.
__device__ void tile_dots(float (&s)[kScores], const float* a, const float* b, int hs) {
  const int ld = row_stride(hs), r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
#pragma unroll
  for (int c = 0; c < kScores; ++c) s[c] = 0.f;
  for (int d = 0; d < padded(hs); d += 4) {
    const float4 x = load4(a + r * ld + d);
#pragma unroll
    for (int c = 0; c < kScores; ++c) {
      const float4 y = load4(b + (lane + kLanes * c) * ld + d);
      s[c] += x.x * y.x, s[c] += x.y * y.y, s[c] += x.z * y.z, s[c] += x.w * y.w;
    }
  }
}

// Over the kLanes lanes of one row (consecutive lanes of a warp). Every lane gets the same bits:
// each step adds the same two values, in either order.
__device__ float row_max(float x) {
  for (int o = kLanes / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ float row_sum(float x) {
  for (int o = kLanes / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// This thread's output columns: chunk j is d(j) .. d(j) + 3, d(j) = 32 j + 4 lane, while below
// padded(hs). kMaxHs / 32 chunks at most.
__device__ inline int chunk(int j) { return 32 * j + 4 * (threadIdx.x % kLanes); }
// acc (this thread's chunks of one row) += sum over the tile's rows u, in order, of w[u] times row u
// of the shared tile m (row stride ld): a row of probabilities or score gradients times v or k.
template <int kChunks>
__device__ void add_weighted_rows(float4 (&acc)[kChunks], const float* w, const float* m, int ld, int hs) {
  for (int u = 0; u < kTile; ++u) {
    const float wu = w[u];
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
      if (chunk(j) < padded(hs)) fma4(acc[j], wu, load4(m + u * ld + chunk(j)));
  }
}
// Writes chunk values to dst[d] for the columns below hs.
__device__ inline void store_chunk(float* dst, int d, const float4& v, float mul, int hs) {
  const float x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if (d + e < hs) dst[d + e] = mul * x[e];
}

// Block (b, h, query tile), the last tiles (the most keys) first.
template <int kMaxHs>
__global__ void __launch_bounds__(kThreads, 2)
    forward_k(float* out, float* lse, const float* qkv, Heads H, float scale, int tiles) {
  constexpr int kChunks = kMaxHs / 32;
  extern __shared__ float4 sh4[];  // float4: the tiles are read 16 bytes at a time
  float* sh = reinterpret_cast<float*>(sh4);
  const int ld = row_stride(H.hs);
  float *q = sh, *k = q + kTile * ld, *v = k + kTile * ld, *p = v + kTile * ld;
  const int tile = tiles - 1 - blockIdx.x % tiles, bh = blockIdx.x / tiles, h = bh % H.NH, b = bh / H.NH;
  const int g = H.kv_head(h), t0 = tile * kTile, r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes, t = t0 + r;
  load_tile(q, qkv + H.q(b, t0, h), H.C3(), min(kTile, H.T - t0), H.hs);
  float4 acc[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  float m = -INFINITY, l = 0.f;
  const int lo = t < H.T ? H.first_key(b, t) : 0;
  for (int u0 = H.first_key(b, t0) / kTile * kTile; u0 <= t0; u0 += kTile) {
    __syncthreads();  // the last tile's k and v are read
    load_tile(k, qkv + H.k(b, u0, g), H.C3(), min(kTile, H.T - u0), H.hs);
    load_tile(v, qkv + H.v(b, u0, g), H.C3(), min(kTile, H.T - u0), H.hs);
    __syncthreads();
    float s[kScores];
    tile_dots(s, q, k, H.hs);
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < kScores; ++c) {
      const int u = u0 + lane + kLanes * c;
      s[c] = lo <= u && u <= t && t < H.T ? s[c] * scale : -INFINITY;  // lo <= u <= t < T: the keys it sees
      mx = fmaxf(mx, s[c]);
    }
    const float m_new = fmaxf(m, row_max(mx));
    const float base = m_new == -INFINITY ? 0.f : m_new;  // a row past T sees no key at all
    const float alpha = expf(m - base);                   // 0 on the first tile (m = -inf)
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < kScores; ++c) {
      const float e = expf(s[c] - base);
      p[r * kScoreStride + lane + kLanes * c] = e;
      sum += e;
    }
    l = l * alpha + row_sum(sum);
    m = m_new;
    __syncwarp();  // row r's probabilities come from the lanes of one warp
#pragma unroll
    for (int j = 0; j < kChunks; ++j) acc[j].x *= alpha, acc[j].y *= alpha, acc[j].z *= alpha, acc[j].w *= alpha;
    add_weighted_rows(acc, p + r * kScoreStride, v, ld, H.hs);
  }
  if (t >= H.T) return;
#pragma unroll
  for (int j = 0; j < kChunks; ++j)
    if (chunk(j) < padded(H.hs)) store_chunk(out + H.o(b, t, h), chunk(j), acc[j], 1.f / l, H.hs);
  if (lane == 0) lse[H.l(b, h, t)] = m + logf(l);
}

// One warp per (b, h, t): D = dout_t . out_t.
__global__ void row_dots_k(float* D, const float* dout, const float* out, Heads H, size_t rows) {
  const size_t w = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / 32;
  if (w >= rows) return;
  const int t = static_cast<int>(w % H.T), h = static_cast<int>(w / H.T % H.NH), b = static_cast<int>(w / H.T / H.NH);
  const size_t at = H.o(b, t, h);
  float s = 0.f;
  for (int d = threadIdx.x % 32; d < H.hs; d += 32) s += dout[at + d] * out[at + d];
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) D[w] = s;
}

// Block (b, key/value head g, key tile), the first tiles (the most queries) first: dk and dv of its
// key rows, summed over the query heads of g in order, each over query tiles t0 >= u0 in order.
template <int kMaxHs>
__global__ void __launch_bounds__(kThreads, 2)
    key_value_k(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D, Heads H,
                float scale, int tiles) {
  constexpr int kChunks = kMaxHs / 32;
  extern __shared__ float4 sh4[];
  float* sh = reinterpret_cast<float*>(sh4);
  const int ld = row_stride(H.hs);
  float *k = sh, *v = k + kTile * ld, *q = v + kTile * ld, *dO = q + kTile * ld;
  float *p = dO + kTile * ld, *ds = p + kTile * kScoreStride, *row_lse = ds + kTile * kScoreStride,
        *row_D = row_lse + kTile;
  const int tile = blockIdx.x % tiles, bg = blockIdx.x / tiles, g = bg % H.NKV, b = bg / H.NKV;
  const int u0 = tile * kTile, r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes, group = H.NH / H.NKV;
  load_tile(k, qkv + H.k(b, u0, g), H.C3(), min(kTile, H.T - u0), H.hs);
  load_tile(v, qkv + H.v(b, u0, g), H.C3(), min(kTile, H.T - u0), H.hs);
  float4 dk[kChunks], dv[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) dk[j] = dv[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int h = g * group; h < (g + 1) * group; ++h)
    for (int t0 = u0; t0 < H.T; t0 += kTile) {
      if (H.first_key(b, t0) >= u0 + kTile) break;  // its rows see none of these keys, nor do later ones'
      const int rows = min(kTile, H.T - t0), t = t0 + r, lo = t < H.T ? H.first_key(b, t) : 0;
      __syncthreads();  // the last query tile is read
      load_tile(q, qkv + H.q(b, t0, h), H.C3(), rows, H.hs);
      load_tile(dO, dout + H.o(b, t0, h), H.C, rows, H.hs);
      if (threadIdx.x < kTile) {
        row_lse[threadIdx.x] = threadIdx.x < rows ? lse[H.l(b, h, t0 + threadIdx.x)] : 0.f;
        row_D[threadIdx.x] = threadIdx.x < rows ? D[H.l(b, h, t0 + threadIdx.x)] : 0.f;
      }
      __syncthreads();
      float s[kScores], dp[kScores];
      tile_dots(s, q, k, H.hs);    // query row r against keys lane + kLanes c
      tile_dots(dp, dO, v, H.hs);  // dout_r . v
#pragma unroll
      for (int c = 0; c < kScores; ++c) {
        const int j = lane + kLanes * c, u = u0 + j;
        const float pr = lo <= u && u <= t && t < H.T && u < H.T ? expf(s[c] * scale - row_lse[r]) : 0.f;
        p[r * kScoreStride + j] = pr;
        ds[r * kScoreStride + j] = pr * (dp[c] - row_D[r]);
      }
      __syncthreads();
      // now this thread's key row r: dv += sum_i p[i][r] dout_i, dk += sum_i dS[i][r] q_i
#pragma unroll 4  // not 32: the registers of 2 blocks per SM hold dk and dv
      for (int i = 0; i < kTile; ++i) {
        const float pi = p[i * kScoreStride + r], dsi = ds[i * kScoreStride + r];
#pragma unroll
        for (int j = 0; j < kChunks; ++j)
          if (chunk(j) < padded(H.hs)) {
            fma4(dv[j], pi, load4(dO + i * ld + chunk(j)));
            fma4(dk[j], dsi, load4(q + i * ld + chunk(j)));
          }
      }
    }
  const int u = u0 + r;
  if (u >= H.T) return;
#pragma unroll
  for (int j = 0; j < kChunks; ++j)
    if (chunk(j) < padded(H.hs)) {
      store_chunk(dqkv + H.k(b, u, g), chunk(j), dk[j], scale, H.hs);
      store_chunk(dqkv + H.v(b, u, g), chunk(j), dv[j], 1.f, H.hs);
    }
}

// Block (b, h, query tile), the last tiles first: dq of its rows over the key tiles in order.
template <int kMaxHs>
__global__ void __launch_bounds__(kThreads, 2)
    query_k(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D, Heads H, float scale,
            int tiles) {
  constexpr int kChunks = kMaxHs / 32;
  extern __shared__ float4 sh4[];
  float* sh = reinterpret_cast<float*>(sh4);
  const int ld = row_stride(H.hs);
  float *q = sh, *dO = q + kTile * ld, *k = dO + kTile * ld, *v = k + kTile * ld, *ds = v + kTile * ld;
  const int tile = tiles - 1 - blockIdx.x % tiles, bh = blockIdx.x / tiles, h = bh % H.NH, b = bh / H.NH;
  const int g = H.kv_head(h), t0 = tile * kTile, r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes, t = t0 + r;
  const int rows = min(kTile, H.T - t0);
  load_tile(q, qkv + H.q(b, t0, h), H.C3(), rows, H.hs);
  load_tile(dO, dout + H.o(b, t0, h), H.C, rows, H.hs);
  const float my_lse = t < H.T ? lse[H.l(b, h, t)] : 0.f, my_D = t < H.T ? D[H.l(b, h, t)] : 0.f;
  const int lo = t < H.T ? H.first_key(b, t) : 0;
  float4 dq[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) dq[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int u0 = H.first_key(b, t0) / kTile * kTile; u0 <= t0; u0 += kTile) {
    __syncthreads();  // the last key tile is read
    load_tile(k, qkv + H.k(b, u0, g), H.C3(), min(kTile, H.T - u0), H.hs);
    load_tile(v, qkv + H.v(b, u0, g), H.C3(), min(kTile, H.T - u0), H.hs);
    __syncthreads();
    float s[kScores], dp[kScores];
    tile_dots(s, q, k, H.hs);
    tile_dots(dp, dO, v, H.hs);
#pragma unroll
    for (int c = 0; c < kScores; ++c) {
      const int u = u0 + lane + kLanes * c;
      const float pr = lo <= u && u <= t && t < H.T ? expf(s[c] * scale - my_lse) : 0.f;
      ds[r * kScoreStride + lane + kLanes * c] = pr * (dp[c] - my_D);
    }
    __syncwarp();  // row r's dS comes from the lanes of one warp
    add_weighted_rows(dq, ds + r * kScoreStride, k, ld, H.hs);
  }
  if (t >= H.T) return;
#pragma unroll
  for (int j = 0; j < kChunks; ++j)
    if (chunk(j) < padded(H.hs)) store_chunk(dqkv + H.q(b, t, h), chunk(j), dq[j], scale, H.hs);
}

// Shared memory per block, in floats, of each kernel: its row tiles and score tiles.
size_t forward_floats(int hs) { return 3 * kTile * row_stride(hs) + kTile * kScoreStride; }
size_t key_value_floats(int hs) { return 4 * kTile * row_stride(hs) + 2 * kTile * kScoreStride + 2 * kTile; }
size_t query_floats(int hs) { return 4 * kTile * row_stride(hs) + kTile * kScoreStride; }

// Lets `kernel` use `bytes` of shared memory per block (above 48 KiB takes an opt-in), or says
// why this GPU cannot.
template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes, int hs) {
  if (bytes <= 48 * 1024) return;
  int device = 0, most = 0;
  PT_CUDA(cudaGetDevice(&device));
  PT_CUDA(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<size_t>(most))
    throw std::runtime_error("GPU attention: head size " + std::to_string(hs) + " needs " + std::to_string(bytes) +
                             " bytes of shared memory per block; this GPU gives at most " + std::to_string(most));
  PT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

Heads heads(int T, int C, int NH, int NKV, const int* doc_start) {
  const int hs = C / NH;
  if (hs > kMaxHeadSize)
    throw std::runtime_error("GPU attention: head size " + std::to_string(hs) + " is over this kernel's " +
                             std::to_string(kMaxHeadSize));
  return Heads{T, C, hs, NH, NKV, doc_start};
}

template <int kMaxHs>
void forward(float* out, float* lse, const float* qkv, int B, const Heads& H, float scale) {
  const int tiles = (H.T + kTile - 1) / kTile;
  const size_t bytes = sizeof(float) * forward_floats(H.hs);
  allow_shared(forward_k<kMaxHs>, bytes, H.hs);
  PT_LAUNCH(forward_k<kMaxHs>, static_cast<unsigned>(B * H.NH * tiles), kThreads, bytes, out, lse, qkv, H, scale,
            tiles);
}

template <int kMaxHs>
void backward(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D, int B, const Heads& H,
              float scale) {
  const int tiles = (H.T + kTile - 1) / kTile;
  const size_t kv_bytes = sizeof(float) * key_value_floats(H.hs), q_bytes = sizeof(float) * query_floats(H.hs);
  allow_shared(key_value_k<kMaxHs>, kv_bytes, H.hs);
  allow_shared(query_k<kMaxHs>, q_bytes, H.hs);
  PT_LAUNCH(key_value_k<kMaxHs>, static_cast<unsigned>(B * H.NKV * tiles), kThreads, kv_bytes, dqkv, dout, qkv, lse, D,
            H, scale, tiles);
  PT_LAUNCH(query_k<kMaxHs>, static_cast<unsigned>(B * H.NH * tiles), kThreads, q_bytes, dqkv, dout, qkv, lse, D, H,
            scale, tiles);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, int NKV,
                       const int* doc_start) {
  if (static_cast<size_t>(B) * T * C == 0) return;
  const Heads H = heads(T, C, NH, NKV, doc_start);
  const float scale = 1.f / sqrtf(static_cast<float>(H.hs));
  if (H.hs <= 64) forward<64>(out, lse, qkv, B, H, scale);
  else if (H.hs <= 128) forward<128>(out, lse, qkv, B, H, scale);
  else forward<256>(out, lse, qkv, B, H, scale);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                        int T, int C, int NH, int NKV, const int* doc_start) {
  if (static_cast<size_t>(B) * T * C == 0) return;
  const Heads H = heads(T, C, NH, NKV, doc_start);
  const float scale = 1.f / sqrtf(static_cast<float>(H.hs));
  const size_t rows = static_cast<size_t>(B) * NH * T;
  float* D = static_cast<float*>(scratch(kDSlot, sizeof(float) * rows));
  PT_LAUNCH(row_dots_k, blocks_for(rows * 32), 256, 0, D, dout, out, H, rows);
  if (H.hs <= 64) backward<64>(dqkv, dout, qkv, lse, D, B, H, scale);
  else if (H.hs <= 128) backward<128>(dqkv, dout, qkv, lse, D, B, H, scale);
  else backward<256>(dqkv, dout, qkv, lse, D, B, H, scale);
}

}  // namespace pipetrain::gpu
