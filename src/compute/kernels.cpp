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
                     int v_begin, int v_rows, const int* pos) {
  KernelTimer timer(Kernel::elementwise);
  parallel_for(static_cast<size_t>(B) * T, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float* o = out + i * C;
      const int row = tokens[i] - v_begin;
      const float* p = wpe ? wpe + (pos ? pos[i] : i % T) * C : nullptr;
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
                      int v_rows, const int* pos) {
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
      float* dp = dwpe + static_cast<size_t>(pos ? pos[b * T + t] : t) * C;
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
  if (dweight && dbias) bias_backward(dbias, dout, N, OC);
}

void bias_backward(float* dbias, const float* dout, int N, int OC) {
  KernelTimer timer(Kernel::elementwise);
  reduce_row_chunks(N, rows_per_chunk(OC), OC, dbias, [&](size_t begin, size_t end, float* partial) {
    for (size_t i = begin; i < end; ++i)
      for (int j = 0; j < OC; ++j) partial[j] += dout[i * OC + j];
  });
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
inline float gelu(float x) { return 0.5f * x * (1.f + fast_tanh(kGeluScale * (x + 0.044715f * x * x * x))); }
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
  KernelTimer timer(Kernel::activation);
  parallel_for(n, kElementsPerChunk, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = gelu(inp[i]);
  });
}

void bias_gelu_forward(float* out, const float* pre, const float* bias, int N, int C) {
  KernelTimer timer(Kernel::activation);
  parallel_for(N, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float* p = pre + i * C;
      float* o = out + i * C;
      for (int c = 0; c < C; ++c) o[c] = gelu(p[c] + bias[c]);
    }
  });
}

namespace {
inline float gelu_slope(float x) {
  const float th = fast_tanh(kGeluScale * (x + 0.044715f * x * x * x));
  return 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * kGeluScale * (1.f + 3.f * 0.044715f * x * x);
}
// Rows [begin, end) of dinp; with a partial, their sums added to it row by row, as bias_backward
// sums them (reduce_row_chunks' chunks of rows_per_chunk(C) rows, rows in order).
template <bool kSum>
void gelu_backward_rows(float* dinp, float* partial, const float* pre, const float* bias, const float* dout,
                        size_t begin, size_t end, int C) {
  for (size_t i = begin; i < end; ++i) {
    const float *x = pre + i * C, *d = dout + i * C;
    float* o = dinp + i * C;
    for (int c = 0; c < C; ++c) {
      o[c] = gelu_slope(x[c] + bias[c]) * d[c];
      if constexpr (kSum) partial[c] += o[c];
    }
  }
}
}  // namespace

void bias_gelu_backward(float* dinp, float* dbias, const float* pre, const float* bias, const float* dout, int N,
                        int C) {
  KernelTimer timer(Kernel::activation);
  if (dbias) {
    reduce_row_chunks(N, rows_per_chunk(C), C, dbias, [&](size_t begin, size_t end, float* partial) {
      gelu_backward_rows<true>(dinp, partial, pre, bias, dout, begin, end, C);
    });
  } else {
    parallel_for(N, rows_per_chunk(C), [&](size_t begin, size_t end) {
      gelu_backward_rows<false>(dinp, nullptr, pre, bias, dout, begin, end, C);
    });
  }
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
  const auto product = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  };
  return best_rate(2.0 * n * n * n, seconds, product) / 1e9;
}

}  // namespace pipetrain
