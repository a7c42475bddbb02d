// Causal self-attention on the CPU (layer_kernels.hpp: the contract), without a T x T matrix: the
// forward runs blocks of kBlock query rows against blocks of kBlock keys with an online softmax
// (each row's running maximum and sum, its output rescaled when the maximum grows) and keeps only
// each row's log-sum-exp; the backward recomputes a block's probabilities from it. Memory is O(T)
// per head (a head's keys and values transposed, a row statistic) plus fixed block scratch, so the
// activation memory of a step no longer grows with T^2 and no length is too long. With a document
// mask a row also skips the keys before its document's start: the key blocks wholly before it are
// never computed, and lanes before it in a block are masked like those after the row.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "pipetrain/compute/cpu_features.hpp"
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/parallel_for.hpp"
#include "pipetrain/compute/profile.hpp"

namespace pipetrain {
namespace {

// Products run in register tiles of kTileRows x kTileCols outputs held while the inner dimension
// runs (8 vector accumulators: enough to keep the FMA units busy on AVX2, few enough not to spill).
// Every output is one sum in sequence over the inner dimension, so the bits depend only on the
// shapes, never on the thread count.
constexpr int kTileRows = 4, kTileCols = 16;
// Query rows and keys per block: a block's scores and their gradients (kBlock x kBlock floats,
// 16 KiB each) and its dk, dv sums stay in the L1/L2 caches at any T. A multiple of kTileCols, so
// every block but a sequence's last is whole tiles.
constexpr int kBlock = 64;
// 8 floats as one vector (GCC/Clang vector extension: one AVX register on x86-64-v3); aligned(4)
// and may_alias let it load from and store to any position of a float array.
typedef float Floats8 __attribute__((vector_size(32), aligned(4), may_alias));

int round_up(int n, int m) { return (n + m - 1) / m * m; }

// Where the CPU has AVX-512, products also run in wide tiles of kTileRows x kWideCols: two
// 16-float registers per row, eight accumulators. Every output is still one sum in sequence over
// the inner dimension, fused multiply-adds as in the narrow tiles, so the bits are the same
// whichever tiles ran (a test holds them to it).
constexpr int kWideCols = 32;
typedef float Floats16 __attribute__((vector_size(64), aligned(4), may_alias));
std::atomic<bool> wide_tiles{cpu_features().level == SimdLevel::avx512};

// c[i][j] (+)= alpha * sum_{p<k} a[i*as + p*ak] * b[p*ldb + j] for i < M and the V vectors of
// columns of a tile: A is read by rows (as = lda, ak = 1) or transposed (as = 1, ak = lda); add
// keeps what c held. Always inlined, so each tile below compiles it for its own instruction set.
// (The vector type comes through Lanes, not as a template argument: one would drop its aligned(4).)
template <int Lanes>
struct VectorOf;
template <>
struct VectorOf<8> {
  using type = Floats8;
};
template <>
struct VectorOf<16> {
  using type = Floats16;
};
template <int Lanes, int V, int M>
__attribute__((always_inline)) inline void tile_products(int k, float alpha, const float* a, size_t as, size_t ak,
                                                         const float* b, size_t ldb, float* c, size_t ldc, bool add) {
  using Vec = typename VectorOf<Lanes>::type;
  Vec acc[M][V] = {};
  for (int p = 0; p < k; ++p, a += ak, b += ldb) {
    Vec bv[V];
    for (int j = 0; j < V; ++j) bv[j] = reinterpret_cast<const Vec*>(b)[j];
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < V; ++j) acc[i][j] += a[i * as] * bv[j];
  }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < V; ++j) {
      Vec& out = reinterpret_cast<Vec*>(c + i * ldc)[j];
      out = add ? out + alpha * acc[i][j] : alpha * acc[i][j];
    }
}

// M rows x kTileCols columns, in AVX2 registers.
template <int M>
void product_tile(int k, float alpha, const float* a, size_t as, size_t ak, const float* b, size_t ldb, float* c,
                  size_t ldc, bool add) {
  tile_products<8, kTileCols / 8, M>(k, alpha, a, as, ak, b, ldb, c, ldc, add);
}

// M rows x kWideCols columns, in AVX-512 registers.
template <int M>
__attribute__((target("avx512f"))) void wide_product_tile(int k, float alpha, const float* a, size_t as, size_t ak,
                                                          const float* b, size_t ldb, float* c, size_t ldc, bool add) {
  tile_products<16, kWideCols / 16, M>(k, alpha, a, as, ak, b, ldb, c, ldc, add);
}

// C[m,n] (+)= alpha * A[m,k] B[k,n], A as product_tile reads it: row tiles of up to kTileRows,
// columns in wide tiles where the CPU has them, then narrow ones, the columns past the last whole
// tile (n not a multiple of kTileCols, e.g. an odd head size) by plain loops.
void product(int m, int n, int k, float alpha, const float* a, size_t as, size_t ak, const float* b, size_t ldb,
             float* c, size_t ldc, bool add) {
  static constexpr decltype(&product_tile<1>) tiles[kTileRows + 1] = {nullptr, product_tile<1>, product_tile<2>,
                                                                      product_tile<3>, product_tile<4>};
  static constexpr decltype(&wide_product_tile<1>) wide[kTileRows + 1] = {
      nullptr, wide_product_tile<1>, wide_product_tile<2>, wide_product_tile<3>, wide_product_tile<4>};
  const bool use_wide = wide_tiles.load(std::memory_order_relaxed);
  for (int i0 = 0; i0 < m; i0 += kTileRows) {
    const int rows = std::min(kTileRows, m - i0);
    const float* ai = a + i0 * as;
    float* ci = c + i0 * ldc;
    int j = 0;
    if (use_wide)
      for (; j + kWideCols <= n; j += kWideCols) wide[rows](k, alpha, ai, as, ak, b + j, ldb, ci + j, ldc, add);
    for (; j + kTileCols <= n; j += kTileCols) tiles[rows](k, alpha, ai, as, ak, b + j, ldb, ci + j, ldc, add);
    for (int i = 0; i < rows; ++i)
      for (int jj = j; jj < n; ++jj) {
        float s = 0.f;
        for (int p = 0; p < k; ++p) s += ai[i * as + p * ak] * b[p * ldb + jj];
        float& out = ci[i * ldc + jj];
        out = add ? out + alpha * s : alpha * s;
      }
  }
}

// The three products of a block of m query rows against a block of n keys, its scores and their
// gradients in kBlock-wide rows. On the diagonal block (rows and keys from one position) a row sees
// only the keys up to its own position, so there each row tile's products stop at the tile's last
// row instead of computing what the mask would drop (a row's lanes past its own position, up to
// whole vectors, are zeroed by the caller and read as zeros).
//
// scores[m, <= n] = alpha A[m, k] Bt[k, n]: A's rows of stride lda, Bt transposed keys (ldb).
void block_scores(bool diagonal, int m, int n, int k, float alpha, const float* a, size_t lda, const float* bt,
                  size_t ldb, float* scores) {
  for (int i0 = 0; i0 < m; i0 += kTileRows) {
    const int rows = std::min(kTileRows, m - i0), cols = diagonal ? std::min(n, round_up(i0 + rows, kTileCols)) : n;
    product(rows, cols, k, alpha, a + i0 * lda, lda, 1, bt, ldb, scores + i0 * kBlock, kBlock, false);
  }
}
// c[m, w] (+)= alpha P[m, n] X[n, w]: a row tile sums the keys it sees.
void block_rows_times(bool diagonal, int m, int n, int w, float alpha, const float* p, const float* x, size_t ldx,
                      float* c, size_t ldc, bool add) {
  for (int i0 = 0; i0 < m; i0 += kTileRows) {
    const int rows = std::min(kTileRows, m - i0), k = diagonal ? std::min(n, i0 + rows) : n;
    product(rows, w, k, alpha, p + i0 * kBlock, kBlock, 1, x, ldx, c + i0 * ldc, ldc, add);
  }
}
// c[n, w] (+)= alpha P^T[n, m] X[m, w]: a tile of keys sums the rows that see it.
void block_keys_times(bool diagonal, int n, int m, int w, float alpha, const float* p, const float* x, size_t ldx,
                      float* c, bool add) {
  for (int c0 = 0; c0 < n; c0 += kTileRows) {
    const int rows = std::min(kTileRows, n - c0), first = diagonal ? c0 : 0;
    product(rows, w, m - first, alpha, p + first * kBlock + c0, 1, kBlock, x + first * ldx, ldx, c + c0 * w, w, add);
  }
}

// xt[i][u] = x[u][i] for a head's T x hs slice (row stride ld), padded with zeros to Tp columns: the
// score products then read 16 consecutive positions as one vector. Row by row of x, so that each
// read is one row's contiguous slice (read column by column, every value was another cache line:
// a third of a short sequence's backward went here).
void transpose_head(float* xt, const float* x, size_t ld, int T, int Tp, int hs) {
  for (int u = 0; u < T; ++u) {
    const float* row = x + u * ld;
    for (int i = 0; i < hs; ++i) xt[static_cast<size_t>(i) * Tp + u] = row[i];
  }
  for (int i = 0; i < hs; ++i)
    std::fill(xt + static_cast<size_t>(i) * Tp + T, xt + static_cast<size_t>(i + 1) * Tp, 0.f);
}

// Lanes [lo, valid) of s[0, w) become exp(s - mx), the others 0; returns their sum. Without a
// document's lower bound the loop is the plain causal one: the compiler sums a masked loop in
// another order, and unmasked runs keep their bits (the golden trajectory).
float exp_lanes(float* s, int lo, int valid, int w, float mx) {
  float sum = 0.f;
  if (lo == 0) {
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < w; ++c) sum += (s[c] = c < valid ? fast_exp(s[c] - mx) : 0.f);
  } else {
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < w; ++c) sum += (s[c] = c >= lo && c < valid ? fast_exp(s[c] - mx) : 0.f);
  }
  return sum;
}

// Row t's softmax over lo <= u <= t of its scores s, into row[0, len) (zero elsewhere), on whole
// 8-float vectors, the lanes outside giving exactly 0. s must hold round_up(t + 1, 8) scores.
void causal_softmax_row(float* s, int lo, int t, float* row, int len) {
  const int w = round_up(t + 1, 8);
  float mx = s[t];
#pragma omp simd reduction(max : mx)
  for (int u = 0; u < w; ++u) mx = u >= lo && u <= t && s[u] > mx ? s[u] : mx;
  const float inv = 1.f / exp_lanes(s, lo, t + 1, w, mx);
  const int n = std::min(w, len);
  for (int u = 0; u < n; ++u) row[u] = s[u] * inv;
  for (int u = n; u < len; ++u) row[u] = 0.f;
}

// Where a (batch, key/value head)'s rows sit in qkv [B, T, C + 2 KV] and its heads' in out and lse.
struct HeadGroup {
  int T, C, hs, NH, NKV, b, g;
  int group() const { return NH / NKV; }
  size_t C3() const { return static_cast<size_t>(C) + 2 * NKV * hs; }
  size_t row0() const { return static_cast<size_t>(b) * T * C3(); }
  size_t q(int h) const { return row0() + static_cast<size_t>(h) * hs; }
  size_t k() const { return row0() + C + static_cast<size_t>(g) * hs; }
  size_t v() const { return k() + static_cast<size_t>(NKV) * hs; }
  size_t out(int h) const { return static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hs; }
  size_t lse(int h) const { return (static_cast<size_t>(b) * NH + h) * T; }
};

}  // namespace

void set_wide_attention_tiles(bool on) { wide_tiles = on && cpu_features().level == SimdLevel::avx512; }

// The forward's and the backward's thread_local buffers below, both kept between calls.
size_t attention_scratch_bytes(int T, int hs, int group) {
  const size_t Tp = round_up(T, kBlock), block = kBlock;
  return sizeof(float) *
         (3 * hs * Tp + 3 * block * block + 3 * block * hs + 2 * block + static_cast<size_t>(group) * T);
}

// Per (batch, key/value head), its keys transposed once; for each query head that reads them and
// each block of query rows, the key blocks from the one holding its first row's document start up
// to the block's last row: the scores, each row's new running maximum, its probabilities against
// that maximum, its running sum and output rescaled by exp(old max - new max), the block's
// probabilities times its values added. A row's keys past its own position, or before its
// document's start, are masked to 0 (a row may see no key of a block: its sums stay as they were).
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, int NKV,
                       const int* doc_start) {
  KernelTimer timer(Kernel::attention);
  count_attention_flops(4.0 * B * T * T * C);
  const int hs = C / NH, Tp = round_up(T, kBlock);
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  // (batch, key/value head) pairs are independent: one per chunk.
  parallel_for(static_cast<size_t>(B) * NKV, 1, [&](size_t bg, size_t) {
    thread_local std::vector<float> kt, s, o, row_max, row_sum;
    kt.resize(static_cast<size_t>(hs) * Tp);
    s.resize(kBlock * kBlock);
    o.resize(static_cast<size_t>(kBlock) * hs);
    row_max.resize(kBlock);
    row_sum.resize(kBlock);
    const HeadGroup at{T, C, hs, NH, NKV, static_cast<int>(bg / NKV), static_cast<int>(bg % NKV)};
    const size_t C3 = at.C3();
    const float* v = qkv + at.v();
    const int* start = doc_start ? doc_start + static_cast<size_t>(at.b) * T : nullptr;
    transpose_head(kt.data(), qkv + at.k(), C3, T, Tp, hs);
    for (int h = at.g * at.group(); h < (at.g + 1) * at.group(); ++h) {
      const float* q = qkv + at.q(h);
      for (int t0 = 0; t0 < T; t0 += kBlock) {
        const int m = std::min(kBlock, T - t0);
        const int u_first = start ? start[t0] / kBlock * kBlock : 0;  // no row sees a key before it
        std::fill_n(row_max.begin(), m, std::numeric_limits<float>::lowest());
        std::fill_n(row_sum.begin(), m, 0.f);
        for (int u0 = u_first; u0 < t0 + m; u0 += kBlock) {
          const int n = std::min(kBlock, t0 + m - u0);  // keys u0 .. u0+n-1 reach a row of the block
          const bool diagonal = u0 == t0;
          block_scores(diagonal, m, round_up(n, kTileCols), hs, scale, q + t0 * C3, C3, kt.data() + u0, Tp, s.data());
          for (int i = 0; i < m; ++i) {
            // Row t sees keys max(u0, its document's start) .. t of the block (none, or at least one).
            const int lo = start ? std::max(0, start[t0 + i] - u0) : 0;
            const int valid = std::min(n, t0 + i - u0 + 1), w = round_up(valid, 8);
            float* si = s.data() + i * kBlock;
            float mx = row_max[i];
            for (int c = lo; c < valid; ++c) mx = std::max(mx, si[c]);
            const float sum = exp_lanes(si, lo, valid, w, mx);
            const float rescale = std::exp(row_max[i] - mx);  // 0 on the row's first keys
            row_sum[i] = row_sum[i] * rescale + sum;
            row_max[i] = mx;
            if (u0 > u_first)
              for (int c = 0; c < hs; ++c) o[static_cast<size_t>(i) * hs + c] *= rescale;
          }
          block_rows_times(diagonal, m, n, hs, 1.f, s.data(), v + u0 * C3, C3, o.data(), hs, u0 > u_first);
        }
        for (int i = 0; i < m; ++i) {
          const float inv = 1.f / row_sum[i];
          float* row = out + at.out(h) + static_cast<size_t>(t0 + i) * C;
          for (int c = 0; c < hs; ++c) row[c] = o[static_cast<size_t>(i) * hs + c] * inv;
          lse[at.lse(h) + t0 + i] = row_max[i] + std::log(row_sum[i]);
        }
      }
    }
  });
}

// As attention_forward, for n new tokens of one sequence at positions pos .. pos+n-1: their keys
// and values join the caches ([pos + n, KV] rows), and their queries attend to every cached
// position from their document's start (doc_start: n absolute positions, or null: 0) up to their
// own, a row's scores whole (generation's rows are few).
void attention_forward_cached(float* out, const float* qkv, float* k_cache, float* v_cache, int pos, int n, int C,
                              int NH, int NKV, const int* doc_start) {
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
        product(m, round_up(end, kTileCols), hs, scale, qkv + static_cast<size_t>(i0) * C3 + h * hs, C3, 1, kt.data(),
                Tp, scores.data(), Tp, false);
        for (int i = 0; i < m; ++i)
          causal_softmax_row(scores.data() + static_cast<size_t>(i) * Tp, doc_start ? doc_start[i0 + i] : 0,
                             pos + i0 + i, probs.data() + static_cast<size_t>(i) * Tp, end);
        product(m, hs, end, 1.f, probs.data(), Tp, 1, v_cache + g * hs, KV, out + static_cast<size_t>(i0) * C + h * hs,
                C, false);
      }
  });
}

// out = p v, p = softmax(scale q k^T). Per (batch, key/value head), by blocks of kBlock keys: for
// each query head reading them and each block of query rows at or after the keys, the block's
// probabilities p = exp(score - lse) and dp = dout v^T recomputed, ds = p (dp - D_t) with
// D_t = dout_t . out_t (= sum_u p_u dp_u), then dq += scale ds k (over key blocks in order),
// dk += scale ds^T q and dv += p^T dout (over the group's heads, then query blocks, in order). Under
// a document mask a key block stops at the first query block whose rows all start after it.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                        int T, int C, int NH, int NKV, const int* doc_start) {
  KernelTimer timer(Kernel::attention);
  count_attention_flops(8.0 * B * T * T * C);
  const int hs = C / NH, Tp = round_up(T, kBlock);
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  parallel_for(static_cast<size_t>(B) * NKV, 1, [&](size_t bg, size_t) {
    thread_local std::vector<float> kt, vt, p, ds, dk, dv, row_dot;
    const HeadGroup at{T, C, hs, NH, NKV, static_cast<int>(bg / NKV), static_cast<int>(bg % NKV)};
    const int group = at.group(), h0 = at.g * group;
    const size_t C3 = at.C3();
    kt.resize(static_cast<size_t>(hs) * Tp);
    vt.resize(static_cast<size_t>(hs) * Tp);
    p.resize(kBlock * kBlock);
    ds.resize(kBlock * kBlock);
    dk.resize(static_cast<size_t>(kBlock) * hs);
    dv.resize(static_cast<size_t>(kBlock) * hs);
    row_dot.resize(static_cast<size_t>(group) * T);
    const float* k = qkv + at.k();
    const int* start = doc_start ? doc_start + static_cast<size_t>(at.b) * T : nullptr;
    transpose_head(kt.data(), k, C3, T, Tp, hs);
    transpose_head(vt.data(), qkv + at.v(), C3, T, Tp, hs);
    // D_t of every query head of the group; dq zeroed, as the key blocks add to it.
    for (int j = 0; j < group; ++j)
      for (int t = 0; t < T; ++t) {
        const float *d = dout + at.out(h0 + j) + static_cast<size_t>(t) * C,
                    *o = out + at.out(h0 + j) + static_cast<size_t>(t) * C;
        float dot = 0.f;
        for (int c = 0; c < hs; ++c) dot += d[c] * o[c];
        row_dot[static_cast<size_t>(j) * T + t] = dot;
        std::fill_n(dqkv + at.q(h0 + j) + t * C3, hs, 0.f);
      }
    for (int u0 = 0; u0 < T; u0 += kBlock) {
      const int n = std::min(kBlock, T - u0), cols = round_up(n, kTileCols);
      bool first = true;  // the first query block writes dk and dv, the others add to them
      for (int j = 0; j < group; ++j) {
        const int h = h0 + j;
        const float *q = qkv + at.q(h), *d = dout + at.out(h), *l = lse + at.lse(h);
        for (int t0 = u0; t0 < T; t0 += kBlock) {   // the query rows that see these keys
          if (start && start[t0] >= u0 + n) break;  // nor do the later ones (the diagonal always does)
          const int m = std::min(kBlock, T - t0);
          const bool diagonal = t0 == u0;
          block_scores(diagonal, m, cols, hs, scale, q + t0 * C3, C3, kt.data() + u0, Tp, p.data());
          block_scores(diagonal, m, cols, hs, 1.f, d + static_cast<size_t>(t0) * C, C, vt.data() + u0, Tp, ds.data());
          for (int i = 0; i < m; ++i) {
            const int t = t0 + i, valid = std::min(n, t - u0 + 1), w = round_up(valid, 8);
            const int lo = start ? std::max(0, start[t] - u0) : 0;
            const float lt = l[t], dt = row_dot[static_cast<size_t>(j) * T + t];
            float *pi = p.data() + i * kBlock, *dsi = ds.data() + i * kBlock;
#pragma omp simd
            for (int c = 0; c < w; ++c) {
              const float pc = c >= lo && c < valid ? fast_exp(pi[c] - lt) : 0.f;
              pi[c] = pc;
              dsi[c] = pc * (dsi[c] - dt);
            }
          }
          block_rows_times(diagonal, m, n, hs, scale, ds.data(), k + u0 * C3, C3, dqkv + at.q(h) + t0 * C3, C3, true);
          block_keys_times(diagonal, n, m, hs, scale, ds.data(), q + t0 * C3, C3, dk.data(), !first);
          block_keys_times(diagonal, n, m, hs, 1.f, p.data(), d + static_cast<size_t>(t0) * C, C, dv.data(), !first);
          first = false;
        }
      }
      for (int u = 0; u < n; ++u) {
        std::copy_n(dk.data() + static_cast<size_t>(u) * hs, hs, dqkv + at.k() + (u0 + u) * C3);
        std::copy_n(dv.data() + static_cast<size_t>(u) * hs, hs, dqkv + at.v() + (u0 + u) * C3);
      }
    }
  });
}

}  // namespace pipetrain
