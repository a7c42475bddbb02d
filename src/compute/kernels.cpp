#include "pipetrain/compute/kernels.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pipetrain/compute/parallel_for.hpp"
#include "pipetrain/compute/profile.hpp"
#include "pipetrain/util/clock.hpp"
#include "row_chunks.hpp"

namespace pipetrain {
void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C,
                     int v_begin, int v_rows) {
  KernelTimer timer(Kernel::elementwise);
  parallel_for(static_cast<size_t>(B) * T, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float* o = out + i * C;
      const int row = tokens[i] - v_begin;
      const float* p = wpe ? wpe + (i % T) * C : nullptr;
      if (row < 0 || row >= v_rows) {  // another tensor rank's token
        if (p) std::copy(p, p + C, o);
        else std::fill(o, o + C, 0.f);
        continue;
      }
      const float* e = wte + static_cast<size_t>(row) * C;
      if (!p) {
        std::copy(e, e + C, o);
        continue;
      }
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  });
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C, int v_begin,
                      int v_rows) {
  KernelTimer timer(Kernel::elementwise);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
      const int row = tokens[b * T + t] - v_begin;
      if (row >= 0 && row < v_rows) {
        float* de = dwte + static_cast<size_t>(row) * C;
        for (int c = 0; c < C; ++c) de[c] += d[c];
      }
      if (!dwpe) continue;
      float* dp = dwpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) dp[c] += d[c];
    }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C) {
  KernelTimer timer(Kernel::norm);
  const float eps = 1e-5f;
  parallel_for(N, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float* x = inp + i * C;
      float m = 0.f;
#pragma omp simd reduction(+ : m)
      for (int c = 0; c < C; ++c) m += x[c];
      m /= C;
      float v = 0.f;
#pragma omp simd reduction(+ : v)
      for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
      v /= C;
      float s = 1.f / std::sqrt(v + eps);
      float* o = out + i * C;
      for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
      mean[i] = m;
      rstd[i] = s;
    }
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  KernelTimer timer(Kernel::norm);
  // partial = [dweight | dbias] of a chunk of rows
  std::vector<float> sums(dweight ? 2 * static_cast<size_t>(C) : 0, 0.f);
  reduce_row_chunks(N, rows_per_chunk(C), sums.size(), sums.data(), [&](size_t begin, size_t end, float* partial) {
    float* pw = partial;
    float* pb = partial + C;
    for (size_t i = begin; i < end; ++i) {
      const float* d = dout + i * C;
      const float* x = inp + i * C;
      const float m = mean[i], s = rstd[i];
      if (dweight) {
#pragma omp simd
        for (int c = 0; c < C; ++c) {
          pb[c] += d[c];
          pw[c] += (x[c] - m) * s * d[c];
        }
      }
      if (!dinp) continue;
      // dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * weight
      // w, a local copy of the captured pointer: through the capture GCC reloaded it on every
      // iteration and ran the reduction below as scalar code (a quarter of the speed)
      const float* w = weight;
      float dnorm_mean = 0.f, dnorm_norm_mean = 0.f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int c = 0; c < C; ++c) {
        float norm = (x[c] - m) * s;
        float dnorm = w[c] * d[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
      float* dx = dinp + i * C;
#pragma omp simd  // the arrays never overlap; too many pointers for GCC to version the loop itself
      for (int c = 0; c < C; ++c) {
        float norm = (x[c] - m) * s;
        dx[c] += s * (w[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean);
      }
    }
  });
  for (int c = 0; c < C && dweight; ++c) {
    dweight[c] += sums[c];
    dbias[c] += sums[C + c];
  }
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
  {
    KernelTimer timer(Kernel::gemm);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.f, inp, C, weight, C, 0.f, out, OC);
    count_gemm_flops(2.0 * N * OC * C);
  }
  if (!bias) return;
  KernelTimer timer(Kernel::elementwise);
  parallel_for(N, rows_per_chunk(OC), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float* o = out + i * OC;
      for (int j = 0; j < OC; ++j) o[j] += bias[j];
    }
  });
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  {
    KernelTimer timer(Kernel::gemm);
    // dinp[N,C] = dout[N,OC] weight[OC,C];  dweight[OC,C] += dout^T inp
    if (dinp) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.f, dout, OC, weight, C, 0.f, dinp, C);
      count_gemm_flops(2.0 * N * OC * C);
    }
    if (dweight) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.f, dout, OC, inp, C, 1.f, dweight, C);
      count_gemm_flops(2.0 * N * OC * C);
    }
  }
  if (!dweight || !dbias) return;
  KernelTimer timer(Kernel::elementwise);
  reduce_row_chunks(N, rows_per_chunk(OC), OC, dbias, [&](size_t begin, size_t end, float* partial) {
    for (size_t i = begin; i < end; ++i)
      for (int j = 0; j < OC; ++j) partial[j] += dout[i * OC + j];
  });
}

namespace {

// Causal attention's products, tile by tile, so that only the lower triangle of each T x T score
// matrix is computed: full-matrix sgemm calls did twice the arithmetic and then masked half of it
// away. A tile is kTileRows x kTileCols outputs held in registers while the inner dimension runs
// (8 vector accumulators: enough to keep the FMA units busy on AVX2, few enough not to spill).
// Every output is one sum in sequence over the inner dimension, so the bits depend only on the
// shapes, never on the thread count.
constexpr int kTileRows = 4, kTileCols = 16;
// 8 floats as one vector (GCC/Clang vector extension: one AVX register on x86-64-v3); aligned(4)
// and may_alias let it load from and store to any position of a float array.
typedef float Floats8 __attribute__((vector_size(32), aligned(4), may_alias));

int round_up(int n, int m) { return (n + m - 1) / m * m; }

// c[i][j] = alpha * sum_{p<k} a[i*as + p*ak] * b[p*ldb + j] for i < M, j < kTileCols: A is read by
// rows (as = lda, ak = 1) or transposed (as = 1, ak = lda).
template <int M>
void product_tile(int k, float alpha, const float* a, size_t as, size_t ak, const float* b, size_t ldb, float* c,
                  size_t ldc) {
  constexpr int V = kTileCols / 8;
  Floats8 acc[M][V] = {};
  for (int p = 0; p < k; ++p, a += ak, b += ldb) {
    Floats8 bv[V];
    for (int j = 0; j < V; ++j) bv[j] = reinterpret_cast<const Floats8*>(b)[j];
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < V; ++j) acc[i][j] += a[i * as] * bv[j];
  }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < V; ++j) reinterpret_cast<Floats8*>(c + i * ldc)[j] = alpha * acc[i][j];
}

// C[m,n] = alpha * A[m,k] B[k,n] for one row tile (m <= kTileRows); columns past the last whole
// tile (n not a multiple of kTileCols, e.g. an odd head size) by plain loops.
void product_rows(int m, int n, int k, float alpha, const float* a, size_t as, size_t ak, const float* b, size_t ldb,
                  float* c, size_t ldc) {
  static constexpr decltype(&product_tile<1>) tiles[kTileRows + 1] = {nullptr, product_tile<1>, product_tile<2>,
                                                                      product_tile<3>, product_tile<4>};
  int j = 0;
  for (; j + kTileCols <= n; j += kTileCols) tiles[m](k, alpha, a, as, ak, b + j, ldb, c + j, ldc);
  for (int i = 0; i < m; ++i)
    for (int jj = j; jj < n; ++jj) {
      float s = 0.f;
      for (int p = 0; p < k; ++p) s += a[i * as + p * ak] * b[p * ldb + jj];
      c[i * ldc + jj] = alpha * s;
    }
}

// xt[i][u] = x[u][i] for a head's T x hs slice (row stride ld), padded with zeros to Tp columns: the
// score tiles then read 16 consecutive positions as one vector.
void transpose_head(float* xt, const float* x, size_t ld, int T, int Tp, int hs) {
  for (int i = 0; i < hs; ++i) {
    float* row = xt + static_cast<size_t>(i) * Tp;
    for (int u = 0; u < T; ++u) row[u] = x[u * ld + i];
    for (int u = T; u < Tp; ++u) row[u] = 0.f;
  }
}

// Row t's softmax over u <= t of its scores s, into row[0, len) (zero past t). It runs on whole
// 8-float vectors, the lanes past t giving exactly 0: rows this short spent most of their time in
// the scalar remainder of each loop otherwise. s must hold round_up(t + 1, 8) scores.
void causal_softmax_row(float* s, int t, float* row, int len) {
  const int w = round_up(t + 1, 8);
  float mx = s[0];
#pragma omp simd reduction(max : mx)
  for (int u = 0; u < w; ++u) mx = u <= t && s[u] > mx ? s[u] : mx;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int u = 0; u < w; ++u) sum += (s[u] = u <= t ? fast_exp(s[u] - mx) : 0.f);
  const float inv = 1.f / sum;
  const int n = std::min(w, len);
  for (int u = 0; u < n; ++u) row[u] = s[u] * inv;
  for (int u = n; u < len; ++u) row[u] = 0.f;
}

}  // namespace

// Per (batch, key/value head), that head's keys transposed once, then for each query head that
// reads them, rows of T in tiles of kTileRows: the tile's scores against keys u < end of the tile,
// the softmax of each row straight away (the scores are still in L1), then the tile's output rows
// from its probabilities. Q of head h and K, V of head g are the hs-wide column slices at offsets
// h*hs, C + g*hs and C + KV + g*hs of qkv's rows (stride C + 2 KV).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, int NKV) {
  KernelTimer timer(Kernel::attention);
  const int hs = C / NH, KV = NKV * hs, C3 = C + 2 * KV, group = NH / NKV, Tp = round_up(T, kTileCols);
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  // (batch, key/value head) pairs are independent: one per chunk.
  parallel_for(static_cast<size_t>(B) * NKV, 1, [&](size_t bg, size_t) {
    thread_local std::vector<float> kt, scores;
    kt.resize(static_cast<size_t>(hs) * Tp);
    scores.resize(static_cast<size_t>(kTileRows) * Tp);
    const int b = static_cast<int>(bg / NKV), g = static_cast<int>(bg % NKV);
    const float* row0 = qkv + static_cast<size_t>(b) * T * C3;
    const float* k = row0 + C + g * hs;
    const float* v = k + KV;
    transpose_head(kt.data(), k, C3, T, Tp, hs);
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const float* q = row0 + h * hs;
      float* a = att + (static_cast<size_t>(b) * NH + h) * T * T;
      float* o = out + static_cast<size_t>(b) * T * C + h * hs;
      for (int t0 = 0; t0 < T; t0 += kTileRows) {
        const int m = std::min(kTileRows, T - t0), end = t0 + m;  // rows t0 .. end-1 see keys u < end
        product_rows(m, round_up(end, kTileCols), hs, scale, q + static_cast<size_t>(t0) * C3, C3, 1, kt.data(), Tp,
                     scores.data(), Tp);
        for (int t = t0; t < end; ++t)
          causal_softmax_row(scores.data() + static_cast<size_t>(t - t0) * Tp, t, a + static_cast<size_t>(t) * T, T);
        // out rows = att rows (zero past each row's own position) times v_u for u < end
        product_rows(m, hs, end, 1.f, a + static_cast<size_t>(t0) * T, T, 1, v, C3, o + static_cast<size_t>(t0) * C, C);
      }
    }
  });
}

// As attention_forward, for n new tokens of one sequence at positions pos .. pos+n-1: their keys
// and values join the caches ([pos + n, KV] rows), and their queries attend to every cached
// position up to their own, with the same tile products and row softmax.
void attention_forward_cached(float* out, const float* qkv, float* k_cache, float* v_cache, int pos, int n, int C,
                              int NH, int NKV) {
  KernelTimer timer(Kernel::attention);
  const int hs = C / NH, KV = NKV * hs, C3 = C + 2 * KV, group = NH / NKV, total = pos + n;
  const int Tp = round_up(total, kTileCols);
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  for (int i = 0; i < n; ++i) {
    const float* row = qkv + static_cast<size_t>(i) * C3;
    std::copy(row + C, row + C + KV, k_cache + static_cast<size_t>(pos + i) * KV);
    std::copy(row + C + KV, row + C3, v_cache + static_cast<size_t>(pos + i) * KV);
  }
  parallel_for(NKV, 1, [&](size_t kv_head, size_t) {
    thread_local std::vector<float> kt, scores, probs;
    kt.resize(static_cast<size_t>(hs) * Tp);
    scores.resize(static_cast<size_t>(kTileRows) * Tp);
    probs.resize(static_cast<size_t>(kTileRows) * Tp);
    const int g = static_cast<int>(kv_head);
    transpose_head(kt.data(), k_cache + g * hs, KV, total, Tp, hs);
    for (int h = g * group; h < (g + 1) * group; ++h)
      for (int i0 = 0; i0 < n; i0 += kTileRows) {
        const int m = std::min(kTileRows, n - i0), end = pos + i0 + m;  // rows see keys u < end
        product_rows(m, round_up(end, kTileCols), hs, scale, qkv + static_cast<size_t>(i0) * C3 + h * hs, C3, 1,
                     kt.data(), Tp, scores.data(), Tp);
        for (int i = 0; i < m; ++i)
          causal_softmax_row(scores.data() + static_cast<size_t>(i) * Tp, pos + i0 + i,
                             probs.data() + static_cast<size_t>(i) * Tp, end);
        product_rows(m, hs, end, 1.f, probs.data(), Tp, 1, v_cache + g * hs, KV,
                     out + static_cast<size_t>(i0) * C + h * hs, C);
      }
  });
}

// out = att v, att = softmax(scale q k^T): datt = dout v^T and dq = scale dpre k by row tiles (only
// u <= t), then dv = att^T dout and dk = scale dpre^T q by tiles of key rows u, over rows t >= u.
// A key/value head's dk and dv sum over the query heads that read it, in head order: the first
// writes them, the others add theirs through a scratch copy.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH,
                        int NKV) {
  KernelTimer timer(Kernel::attention);
  const int hs = C / NH, KV = NKV * hs, C3 = C + 2 * KV, group = NH / NKV, Tp = round_up(T, kTileCols);
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  parallel_for(static_cast<size_t>(B) * NKV, 1, [&](size_t bg, size_t) {
    thread_local std::vector<float> vt, dpre, dkv;
    vt.resize(static_cast<size_t>(hs) * Tp);
    dpre.resize(static_cast<size_t>(T) * Tp);
    if (group > 1) dkv.resize(2 * static_cast<size_t>(T) * hs);
    const int b = static_cast<int>(bg / NKV), g = static_cast<int>(bg % NKV);
    const size_t row0 = static_cast<size_t>(b) * T * C3;
    const float *k = qkv + row0 + C + g * hs, *v = k + KV;
    float *dk_head = dqkv + row0 + C + g * hs, *dv_head = dk_head + KV;
    transpose_head(vt.data(), v, C3, T, Tp, hs);
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const float* q = qkv + row0 + h * hs;
      float* dq = dqkv + row0 + h * hs;
      const float* a = att + (static_cast<size_t>(b) * NH + h) * T * T;
      const float* d = dout + static_cast<size_t>(b) * T * C + h * hs;
      for (int t0 = 0; t0 < T; t0 += kTileRows) {
        const int m = std::min(kTileRows, T - t0), end = t0 + m;
        float* dp = dpre.data() + static_cast<size_t>(t0) * Tp;
        product_rows(m, round_up(end, kTileCols), hs, 1.f, d + static_cast<size_t>(t0) * C, C, 1, vt.data(), Tp, dp,
                     Tp);
        // softmax backward, in place: dpre = a * (datt - sum(a * datt)) for u <= t; zero for
        // t < u < end, the part of the tile the products below read. As in forward on whole vectors
        // where the row has room: a is 0 past t, so those lanes add nothing and come out 0.
        for (int t = t0; t < end; ++t) {
          const float* ar = a + static_cast<size_t>(t) * T;
          float* dr = dp + static_cast<size_t>(t - t0) * Tp;
          const int w = std::min(round_up(t + 1, 8), T);
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int u = 0; u < w; ++u) dot += ar[u] * dr[u];
          for (int u = 0; u < w; ++u) dr[u] = ar[u] * (dr[u] - dot);
          for (int u = w; u < end; ++u) dr[u] = 0.f;
        }
        product_rows(m, hs, end, scale, dp, Tp, 1, k, C3, dq + static_cast<size_t>(t0) * C3, C3);
      }
      const bool first = h == g * group;  // writes dk, dv; later heads of the group add to them
      float* dk = first ? dk_head : dkv.data();
      float* dv = first ? dv_head : dkv.data() + static_cast<size_t>(T) * hs;
      const size_t ld = first ? C3 : hs;
      for (int u0 = 0; u0 < T; u0 += kTileRows) {
        const int m = std::min(kTileRows, T - u0), rows = T - u0;  // key rows u0.., query rows t >= u0
        const size_t u = u0;
        // A transposed: its rows are att's / dpre's columns u0.., read from row u0 on
        product_rows(m, hs, rows, 1.f, a + u * T + u, 1, T, d + u * C, C, dv + u * ld, ld);
        product_rows(m, hs, rows, scale, dpre.data() + u * Tp + u, 1, Tp, q + u * C3, C3, dk + u * ld, ld);
      }
      if (first) continue;
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < hs; ++i) {
          dk_head[static_cast<size_t>(t) * C3 + i] += dk[static_cast<size_t>(t) * hs + i];
          dv_head[static_cast<size_t>(t) * C3 + i] += dv[static_cast<size_t>(t) * hs + i];
        }
    }
  });
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
}

// tanh as a 13/6 rational function on [-7.9, 7.9] (beyond, tanh is +-1 in float): within a few
// float ulps of std::tanh, branch-free so the GELU loops vectorise. A profile of the small config
// had libm's tanhf/expm1f at a quarter of the step.
float fast_tanh(float x) {
  x = std::min(7.90531110763549805f, std::max(-7.90531110763549805f, x));
  const float x2 = x * x;
  float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = x2 * p + -8.60467152213735e-11f;
  p = x2 * p + 5.12229709037114e-08f;
  p = x2 * p + 1.48572235717979e-05f;
  p = x2 * p + 6.37261928875436e-04f;
  p = x2 * p + 4.89352455891786e-03f;
  p = x * p;
  float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = x2 * q + 2.26843463243900e-03f;
  q = x2 * q + 4.89352518554385e-03f;
  return p / q;
}

// exp as 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p a degree-6 polynomial (Cephes expf):
// within 2 float ulps of std::exp, branch-free so the softmax loops vectorise. Inputs below -87.3
// give ~1e-38 instead of a denormal, which no softmax sum can notice.
float fast_exp(float x) {
  x = x > 88.3762626647949f ? 88.3762626647949f : (x < -87.3365447504f ? -87.3365447504f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 split in two for exactness
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

namespace {
inline float gelu(float x) { return 0.5f * x * (1.f + fast_tanh(kGeluScale * (x + 0.044715f * x * x * x))); }
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
  KernelTimer timer(Kernel::activation);
  parallel_for(n, kElementsPerChunk, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = gelu(inp[i]);
  });
}

void bias_gelu_forward(float* pre, float* out, const float* bias, int N, int C) {
  KernelTimer timer(Kernel::activation);
  parallel_for(N, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float* p = pre + i * C;
      float* o = out + i * C;
      for (int c = 0; c < C; ++c) o[c] = gelu(p[c] += bias[c]);
    }
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  KernelTimer timer(Kernel::activation);
  parallel_for(n, kElementsPerChunk, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float x = inp[i];
      float u = kGeluScale * (x + 0.044715f * x * x * x);
      float th = fast_tanh(u);
      float sech2 = 1.f - th * th;
      float grad = 0.5f * (1.f + th) + 0.5f * x * sech2 * kGeluScale * (1.f + 3.f * 0.044715f * x * x);
      dinp[i] = grad * dout[i];
    }
  });
}

void residual_forward(float* out, const float* a, const float* b, const float* bias, int N, int C) {
  KernelTimer timer(Kernel::elementwise);
  parallel_for(N, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float *x = a + i * C, *y = b + i * C;
      float* o = out + i * C;
      if (!bias) {
#pragma omp simd
        for (int c = 0; c < C; ++c) o[c] = x[c] + y[c];
        continue;
      }
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = x[c] + y[c] + bias[c];
    }
  });
}

double softmax_crossentropy_forward(float* probs, const float* logits, const int* targets, int N, int V) {
  KernelTimer timer(Kernel::softmax);
  // one loss per row, summed in row order afterwards: the same total on any thread count
  std::vector<double> row_loss(N);
  parallel_for(N, rows_per_chunk(V), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float* l = logits + i * V;
      float* p = probs + i * V;
      float mx = l[0];
#pragma omp simd reduction(max : mx)
      for (int j = 1; j < V; ++j) mx = l[j] > mx ? l[j] : mx;
      double sum = 0.0;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) sum += (p[j] = fast_exp(l[j] - mx));
      const float inv = static_cast<float>(1.0 / sum);
      for (int j = 0; j < V; ++j) p[j] *= inv;
      // log-sum-exp in double rather than log(p[target]) so tiny probabilities do not lose digits
      row_loss[i] = std::log(sum) + mx - l[targets[i]];
    }
  });
  double loss = 0.0;
  for (double l : row_loss) loss += l;
  return loss;
}

void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float scale, int N, int V,
                                   int v_begin) {
  KernelTimer timer(Kernel::softmax);
  parallel_for(N, rows_per_chunk(V), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float* p = probs + i * V;
      float* d = dlogits + i * V;
      for (int j = 0; j < V; ++j) d[j] = p[j] * scale;
      const int t = targets[i] - v_begin;
      if (t >= 0 && t < V) d[t] -= scale;
    }
  });
}

double time_sgemms(int n, int reps) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a.size());
  const double t0 = now_s();
  for (int r = 0; r < reps; ++r)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  return now_s() - t0;
}

double measure_sgemm_gflops(int n, double seconds) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a.size());
  double best = 0, spent = 0;
  while (spent < seconds) {
    const double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    const double dt = now_s() - t0;
    spent += dt;
    best = std::max(best, 2.0 * n * n * n / dt / 1e9);
  }
  return best;
}

}  // namespace pipetrain
