#include "pipetrain/compute/moe_kernels.hpp"

#include <algorithm>
#include <cmath>

#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/profile.hpp"
#include "row_chunks.hpp"

namespace pipetrain {

size_t MoeRouting::bytes() const {
  return sizeof(int) * (expert.size() + row.size() + token.size() + offsets.size() + chosen.size()) +
         sizeof(float) * weight.size();
}

MoeRouting::operator RoutedSlots() const {
  return {N, k, E, rows(), expert.data(), weight.data(), row.data(), token.data(), chosen.data()};
}

RoutedSlots RoutedSlotsCopy::of(const MoeRouting& r) {
  RoutedSlots s = r;
  if (compute_device() != Device::gpu) return s;
  const size_t slots = static_cast<size_t>(r.N) * r.k;
  std::vector<int> packed;
  packed.reserve(2 * slots + r.rows() + r.E);
  packed.insert(packed.end(), r.expert.begin(), r.expert.end());
  packed.insert(packed.end(), r.row.begin(), r.row.end());
  packed.insert(packed.end(), r.token.begin(), r.token.begin() + r.rows());
  packed.insert(packed.end(), r.chosen.begin(), r.chosen.end());
  ints_.assign(packed.data(), packed.size());
  weights_.assign(r.weight.data(), slots);
  s.expert = ints_.data();
  s.row = s.expert + slots;
  s.token = s.row + slots;
  s.chosen = s.token + r.rows();
  s.weight = weights_.data();
  return s;
}

size_t moe_routing_bytes(int N, int k, int E) {
  return sizeof(int) * (4 * static_cast<size_t>(N) * k + 2 * static_cast<size_t>(E) + 1);
}

int moe_capacity(double factor, int N, int E, int k) {
  if (factor <= 0) return N * k;
  return std::min(N * k, static_cast<int>(std::ceil(factor * N * k / E)));
}

void moe_route(MoeRouting& r, const float* probs, int N, int E, int k, bool norm_topk, int capacity) {
  KernelTimer timer(Kernel::routing);
  r.N = N, r.k = k, r.E = E;
  const size_t slots = static_cast<size_t>(N) * k;
  r.expert.resize(slots);
  r.weight.resize(slots);
  r.row.resize(slots);
  r.chosen.assign(E, 0);
  r.offsets.assign(E + 1, 0);
  std::vector<int>& kept = r.offsets;  // counted in offsets[e + 1] first, then summed into starts
  for (int t = 0; t < N; ++t) {
    const float* p = probs + static_cast<size_t>(t) * E;
    int* ex = r.expert.data() + static_cast<size_t>(t) * k;
    float* w = r.weight.data() + static_cast<size_t>(t) * k;
    float sum = 0;
    for (int s = 0; s < k; ++s) {  // the s-th largest not taken yet; a tie goes to the lower expert
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (std::find(ex, ex + s, e) != ex + s) continue;
        if (best < 0 || p[e] > p[best]) best = e;
      }
      ex[s] = best;
      w[s] = p[best];
      sum += p[best];
    }
    for (int s = 0; s < k; ++s) {
      if (norm_topk) w[s] /= sum;
      const int e = ex[s];
      ++r.chosen[e];
      r.row[static_cast<size_t>(t) * k + s] = kept[e + 1] < capacity ? kept[e + 1]++ : -1;  // its place within e
    }
  }
  for (int e = 0; e < E; ++e) r.offsets[e + 1] += r.offsets[e];
  r.token.resize(slots);  // rows() of them used
  for (size_t i = 0; i < slots; ++i) {
    if (r.row[i] < 0) continue;
    r.row[i] += r.offsets[r.expert[i]];
    r.token[r.row[i]] = static_cast<int>(i / k);
  }
}

void router_softmax_forward(float* probs, float* lse, const float* logits, int N, int E) {
  KernelTimer timer(Kernel::routing);
  parallel_for(N, rows_per_chunk(E), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      const float* x = logits + t * E;
      float* p = probs + t * E;
      const float mx = *std::max_element(x, x + E);
      double sum = 0;
      for (int e = 0; e < E; ++e) sum += std::exp(static_cast<double>(x[e]) - mx);
      const double log_sum = std::log(sum);
      for (int e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(x[e]) - mx - log_sum));
      lse[t] = static_cast<float>(mx + log_sum);
    }
  });
}

void router_backward(float* dlogits, const float* dweight, const float* probs, const float* lse, const RoutedSlots& r,
                     bool norm_topk, float aux_scale, float z_scale) {
  KernelTimer timer(Kernel::routing);
  const int N = r.N, E = r.E, k = r.k;
  // d(aux)/d(p_te) = E f_e / N, the same for every token.
  std::vector<float> aux_dp(E);
  for (int e = 0; e < E; ++e) aux_dp[e] = aux_scale * E * (static_cast<float>(r.chosen[e]) / N) / N;
  const float z_per_token = 2.f * z_scale / N;
  parallel_for(N, rows_per_chunk(E), [&](size_t begin, size_t end) {
    std::vector<float> dp(E);
    for (size_t t = begin; t < end; ++t) {
      const float* p = probs + t * E;
      std::copy(aux_dp.begin(), aux_dp.end(), dp.begin());
      if (dweight) {
        const float* dw = dweight + t * k;
        const float* w = r.weight + t * k;
        const int* ex = r.expert + t * k;
        // w_s = p_s / S (norm_topk) or p_s: dp_s = (dw_s - sum_u dw_u w_u) / S, or dw_s.
        float sum = 0, dot = 0;
        for (int s = 0; s < k; ++s) {
          sum += p[ex[s]];
          dot += dw[s] * w[s];
        }
        for (int s = 0; s < k; ++s) dp[ex[s]] += norm_topk ? (dw[s] - dot) / sum : dw[s];
      }
      float pdp = 0;
      for (int e = 0; e < E; ++e) pdp += p[e] * dp[e];
      float* dl = dlogits + t * E;
      const float z = z_per_token * lse[t];
      for (int e = 0; e < E; ++e) dl[e] = p[e] * (dp[e] - pdp) + z * p[e];
    }
  });
}

RouterLosses router_losses(const float* probs, const float* lse, const MoeRouting& r) {
  KernelTimer timer(Kernel::routing);
  const int N = r.N, E = r.E;
  std::vector<double> mean_p(E, 0);
  double z = 0;
  for (int t = 0; t < N; ++t) {
    for (int e = 0; e < E; ++e) mean_p[e] += probs[static_cast<size_t>(t) * E + e];
    z += static_cast<double>(lse[t]) * lse[t];
  }
  RouterLosses out;
  for (int e = 0; e < E; ++e) out.aux += (static_cast<double>(r.chosen[e]) / N) * (mean_p[e] / N);
  out.aux *= E;
  out.z = z / N;
  return out;
}

void moe_gather(float* xs, const float* x, const RoutedSlots& r, int C) {
  KernelTimer timer(Kernel::routing);
  parallel_for(r.rows, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) std::copy_n(x + static_cast<size_t>(r.token[i]) * C, C, xs + i * C);
  });
}

void moe_combine_forward(float* out, const float* y, const RoutedSlots& r, int C, bool accumulate) {
  KernelTimer timer(Kernel::routing);
  const int k = r.k;
  parallel_for(r.N, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      float* o = out + t * C;
      if (!accumulate) std::fill(o, o + C, 0.f);
      for (int s = 0; s < k; ++s) {
        const int row = r.row[t * k + s];
        if (row < 0) continue;
        const float w = r.weight[t * k + s], *yr = y + static_cast<size_t>(row) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) o[c] += w * yr[c];
      }
    }
  });
}

void shared_gate_forward(float* out, float* gate, const float* shared, int N, int C) {
  KernelTimer timer(Kernel::routing);
  for (int t = 0; t < N; ++t) gate[t] = 1.f / (1.f + std::exp(-gate[t]));
  parallel_for(N, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      const float g = gate[t], *s = shared + t * C;
      float* o = out + t * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = g * s[c];
    }
  });
}

void shared_gate_backward(float* dshared, float* dgate, const float* dout, const float* shared, const float* gate,
                          int N, int C) {
  KernelTimer timer(Kernel::routing);
  parallel_for(N, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      const float g = gate[t], *d = dout + t * C;
      float* ds = dshared + t * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) ds[c] = g * d[c];
      if (!dgate) continue;
      const float* s = shared + t * C;
      double dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int c = 0; c < C; ++c) dot += static_cast<double>(d[c]) * s[c];
      dgate[t] = static_cast<float>(dot);
    }
  });
}

void sigmoid_backward(float* dlogit, const float* dgate, const float* gate, int N) {
  KernelTimer timer(Kernel::routing);
  for (int t = 0; t < N; ++t) dlogit[t] = dgate[t] * gate[t] * (1.f - gate[t]);
}

void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y, const RoutedSlots& r, int C) {
  KernelTimer timer(Kernel::routing);
  const int k = r.k;
  parallel_for(r.N, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      const float* d = dout + t * C;
      for (int s = 0; s < k; ++s) {
        const int row = r.row[t * k + s];
        if (row < 0) {
          if (dweight) dweight[t * k + s] = 0;
          continue;
        }
        if (dy) {
          const float w = r.weight[t * k + s];
          float* dyr = dy + static_cast<size_t>(row) * C;
#pragma omp simd
          for (int c = 0; c < C; ++c) dyr[c] = w * d[c];
        }
        if (dweight) {
          const float* yr = y + static_cast<size_t>(row) * C;
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int c = 0; c < C; ++c) dot += d[c] * yr[c];
          dweight[t * k + s] = dot;
        }
      }
    }
  });
}

void moe_scatter_add(float* dx, const float* dxs, const RoutedSlots& r, int C) {
  KernelTimer timer(Kernel::routing);
  const int k = r.k;
  parallel_for(r.N, rows_per_chunk(C), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      float* o = dx + t * C;
      for (int s = 0; s < k; ++s) {
        const int row = r.row[t * k + s];
        if (row < 0) continue;
        const float* g = dxs + static_cast<size_t>(row) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) o[c] += g[c];
      }
    }
  });
}

void grouped_matmul_forward(const Kernels& k, float* out, const float* inp, const float* weight, const int* offsets,
                            int E, int C, int OC) {
  for (int e = 0; e < E; ++e) {
    const int n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    k.matmul_forward(out + static_cast<size_t>(offsets[e]) * OC, inp + static_cast<size_t>(offsets[e]) * C,
                     weight + static_cast<size_t>(e) * OC * C, nullptr, n, C, OC);
  }
}

void grouped_matmul_backward(const Kernels& k, float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const int* offsets, int E, int C, int OC) {
  for (int e = 0; e < E; ++e) {
    const size_t first = offsets[e];
    const int n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    k.matmul_backward(dinp ? dinp + first * C : nullptr, dweight ? dweight + static_cast<size_t>(e) * OC * C : nullptr,
                      nullptr, dout + first * OC, inp ? inp + first * C : nullptr,
                      weight ? weight + static_cast<size_t>(e) * OC * C : nullptr, n, C, OC);
  }
}

}  // namespace pipetrain
