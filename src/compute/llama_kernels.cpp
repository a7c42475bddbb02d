// The CPU kernels only the llama family uses (layer_kernels.hpp has their contracts): RMSNorm,
// rotary position embeddings and the SwiGLU activation. Attention with grouped key/value heads is
// kernels.cpp's, which both families share.
#include <algorithm>
#include <cmath>
#include <vector>

#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/profile.hpp"
#include "row_chunks.hpp"

namespace pipetrain {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  KernelTimer timer(Kernel::norm);
  parallel_for(N, rows_per_chunk(C), [&](size_t begin, size_t end) {
    const float* w = weight;
    for (size_t i = begin; i < end; ++i) {
      const float* x = inp + i * C;
      float sq = 0.f;
#pragma omp simd reduction(+ : sq)
      for (int c = 0; c < C; ++c) sq += x[c] * x[c];
      const float s = 1.f / std::sqrt(sq / C + eps);
      rstd[i] = s;
      float* o = out + i * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = x[c] * s * w[c];
    }
  });
}

// y = x r w, r = (mean(x^2) + eps)^(-1/2): dweight += dout x r; dinp += r (dn - norm mean(dn norm))
// with dn = dout w and norm = x r.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  KernelTimer timer(Kernel::norm);
  std::vector<float> sums(dweight ? static_cast<size_t>(C) : 0, 0.f);
  reduce_row_chunks(N, rows_per_chunk(C), sums.size(), sums.data(), [&](size_t begin, size_t end, float* partial) {
    const float* w = weight;
    for (size_t i = begin; i < end; ++i) {
      const float* d = dout + i * C;
      const float* x = inp + i * C;
      const float s = rstd[i];
      if (dweight) {
#pragma omp simd
        for (int c = 0; c < C; ++c) partial[c] += x[c] * s * d[c];
      }
      if (!dinp) continue;
      float dn_norm = 0.f;
#pragma omp simd reduction(+ : dn_norm)
      for (int c = 0; c < C; ++c) dn_norm += w[c] * d[c] * x[c] * s;
      dn_norm /= C;
      float* dx = dinp + i * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) dx[c] += s * (w[c] * d[c] - x[c] * s * dn_norm);
    }
  });
  for (int c = 0; c < C && dweight; ++c) dweight[c] += sums[c];
}

namespace {

// cos and sin of each position's angles, [T, hs/2] each: position p, pair i turns by
// p theta^(-2i/hs) (computed in double, then rounded).
struct RotaryTable {
  RotaryTable(int T, int hs, float theta, int pos0)
      : T(T), hs(hs), theta(theta), pos0(pos0), half(hs / 2), cos(static_cast<size_t>(T) * half), sin(cos) {
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < half; ++i) {
        const double angle = (pos0 + t) * std::pow(static_cast<double>(theta), -2.0 * i / hs);
        cos[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(angle));
        sin[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(angle));
      }
  }
  bool is_for(int t, int h, float th, int p) const { return T == t && hs == h && theta == th && pos0 == p; }
  int T, hs;
  float theta;
  int pos0, half;
  std::vector<float> cos, sin;
};

// The table for these positions: every block's forward and backward of a run asks for the same
// one, so the last is kept rather than its T x hs/2 sines and cosines recomputed each call.
const RotaryTable& rotary_table(int T, int hs, float theta, int pos0) {
  thread_local RotaryTable last(0, 0, 1.f, 0);
  if (!last.is_for(T, hs, theta, pos0)) last = RotaryTable(T, hs, theta, pos0);
  return last;
}

// Rotates every q and k head of qkv's rows by its position's angles; `inverse` turns the other way
// (the transpose of the rotation: what backward applies to dq and dk).
// With `pos`, row r turns by position pos[r]: a table from position 0 (to T - 1 at least, so
// that training's micro-batches share one).
void rotate(float* qkv, int B, int T, int C, int NH, int NKV, float theta, int pos0, const int* pos, bool inverse) {
  KernelTimer timer(Kernel::rope);
  const int hs = C / NH, heads = NH + NKV, C3 = C + 2 * NKV * hs;
  const size_t rows = static_cast<size_t>(B) * T;
  const RotaryTable& table = pos ? rotary_table(std::max(T, *std::max_element(pos, pos + rows) + 1), hs, theta, 0)
                                 : rotary_table(T, hs, theta, pos0);
  const int half = table.half;
  const float sign = inverse ? -1.f : 1.f;
  parallel_for(rows, rows_per_chunk(C3), [&](size_t begin, size_t end) {
    for (size_t row = begin; row < end; ++row) {
      const size_t at = pos ? pos[row] : row % T;
      const float* c = table.cos.data() + at * half;
      const float* s = table.sin.data() + at * half;
      for (int h = 0; h < heads; ++h) {  // the q heads, then the k heads right after them
        float* x = qkv + row * C3 + static_cast<size_t>(h) * hs;
#pragma omp simd
        for (int i = 0; i < half; ++i) {
          const float a = x[i], b = x[i + half], si = sign * s[i];
          x[i] = a * c[i] - b * si;
          x[i + half] = b * c[i] + a * si;
        }
      }
    }
  });
}

inline float sigmoid(float x) { return 1.f / (1.f + fast_exp(-x)); }

}  // namespace

void rope_forward(float* qkv, int B, int T, int C, int NH, int NKV, float theta, int pos0, const int* pos) {
  rotate(qkv, B, T, C, NH, NKV, theta, pos0, pos, false);
}
void rope_backward(float* dqkv, int B, int T, int C, int NH, int NKV, float theta, int pos0, const int* pos) {
  rotate(dqkv, B, T, C, NH, NKV, theta, pos0, pos, true);
}

void swiglu_forward(float* out, const float* gate_up, int N, int H) {
  KernelTimer timer(Kernel::activation);
  parallel_for(N, rows_per_chunk(2 * H), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float *g = gate_up + i * 2 * H, *u = g + H;
      float* o = out + i * H;
#pragma omp simd
      for (int j = 0; j < H; ++j) o[j] = g[j] * sigmoid(g[j]) * u[j];
    }
  });
}

// silu(g) = g s(g), silu'(g) = s(g) (1 + g (1 - s(g))): dgate = dout u silu'(g), dup = dout silu(g).
void swiglu_backward(float* dgate_up, const float* gate_up, const float* dout, int N, int H) {
  KernelTimer timer(Kernel::activation);
  parallel_for(N, rows_per_chunk(2 * H), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float *g = gate_up + i * 2 * H, *u = g + H, *d = dout + i * H;
      float *dg = dgate_up + i * 2 * H, *du = dg + H;
#pragma omp simd
      for (int j = 0; j < H; ++j) {
        const float s = sigmoid(g[j]);
        dg[j] = d[j] * u[j] * s * (1.f + g[j] * (1.f - s));
        du[j] = d[j] * g[j] * s;
      }
    }
  });
}

}  // namespace pipetrain
