// Element-wise, LayerNorm, loss and optimizer kernels of the GPU build (see gpu_kernels.hpp).
#include <cmath>
#include <vector>

#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "reduce.cuh"

namespace pipetrain::gpu {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

__device__ inline float gelu(float x) { return 0.5f * x * (1.f + tanhf(kGeluScale * (x + 0.044715f * x * x * x))); }

// One warp per row.
__global__ void layernorm_forward_k(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                    const float* bias, int N, int C) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float s = 0.f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / C;
  float v = 0.f;
  for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
  const float r = 1.f / sqrtf(warp_sum(v) / C + 1e-5f);
  float* o = out + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}
__global__ void layernorm_backward_input_k(float* dinp, const float* dout, const float* inp, const float* weight,
                                           const float* mean, const float* rstd, int N, int C) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t off = static_cast<size_t>(row) * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_mean = 0.f, dnorm_norm_mean = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float dnorm = weight[c] * dout[off + c];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * (inp[off + c] - m) * s;
  }
  dnorm_mean = warp_sum(dnorm_mean) / C;
  dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
  for (int c = lane; c < C; c += 32) {
    const float norm = (inp[off + c] - m) * s;
    dinp[off + c] += s * (weight[c] * dout[off + c] - dnorm_mean - norm * dnorm_norm_mean);
  }
}
struct LayerNormWeightGrad {  // dout * normalised input
  const float *dout, *inp, *mean, *rstd;
  int C;
  __device__ float operator()(int r, int c) const {
    const size_t i = static_cast<size_t>(r) * C + c;
    return dout[i] * (inp[i] - mean[r]) * rstd[r];
  }
};

__global__ void gelu_forward_k(float* out, const float* inp, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = gelu(inp[i]);
}
__global__ void bias_gelu_forward_k(float* out, const float* pre, const float* bias, int C, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = gelu(pre[i] + bias[i % C]);
}
__global__ void bias_gelu_backward_k(float* dinp, const float* pre, const float* bias, int C, const float* dout,
                                     size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = pre[i] + bias[i % C], th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
  const float grad = 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * kGeluScale * (1.f + 3.f * 0.044715f * x * x);
  dinp[i] = grad * dout[i];
}
__global__ void residual_forward_k(float* out, const float* a, const float* b, const float* bias, int C, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i] + (bias ? bias[i % C] : 0.f);
}

// One block per row: probabilities and the row's loss log(sum exp(l - max)) + max - l[target], the
// sum and the loss in double as on the CPU (a float sum of 128k terms loses digits of the loss).
__global__ void softmax_crossentropy_forward_k(float* probs, double* row_loss, const float* logits, const int* targets,
                                               int V) {
  __shared__ float shared32[32];
  __shared__ double shared32d[32];
  const size_t off = static_cast<size_t>(blockIdx.x) * V;
  const float* l = logits + off;
  float mx = -FLT_MAX;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_max(mx, shared32);
  double sum = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(l[j] - mx);
  sum = block_sum(sum, shared32d);
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = threadIdx.x; j < V; j += blockDim.x) probs[off + j] = expf(l[j] - mx) * inv;
  if (threadIdx.x == 0) row_loss[blockIdx.x] = log(sum) + mx - l[targets[blockIdx.x]];
}
__global__ void softmax_crossentropy_backward_k(float* dlogits, const float* probs, const int* targets, float scale,
                                                int V, int v_begin, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int j = static_cast<int>(i % V);
  dlogits[i] = (probs[i] - (j == targets[i / V] - v_begin ? 1.f : 0.f)) * scale;
}

__global__ void adamw_k(float* w, const float* grad, float* m, float* v, size_t n, float beta1, float beta2,
                        float step_size, float inv_sqrt_bc2, float eps, float decay, float grad_mul) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float g = grad[i] * grad_mul;
  const float mi = beta1 * m[i] + (1.f - beta1) * g, vi = beta2 * v[i] + (1.f - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  w[i] = w[i] * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
}

constexpr int kSquareBlocks = 1024;  // fixed, so the partial sums always split the same way
__global__ void sum_of_squares_k(double* partial, const float* x, size_t n) {
  __shared__ double sh[256];
  double s = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    s += static_cast<double>(x[i]) * x[i];
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sh[threadIdx.x] += sh[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C) {
  PT_LAUNCH(layernorm_forward_k, blocks_for(static_cast<size_t>(N) * 32), 256, 0, out, mean, rstd, inp, weight, bias, N,
            C);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  if (dweight) {
    column_sum_add(dweight, N, C, LayerNormWeightGrad{dout, inp, mean, rstd, C}, 0);
    column_sum_add(dbias, N, C, Element{dout, C}, 1);
  }
  if (dinp) {
    PT_LAUNCH(layernorm_backward_input_k, blocks_for(static_cast<size_t>(N) * 32), 256, 0, dinp, dout, inp, weight,
              mean, rstd, N, C);
  }
}

void gelu_forward(float* out, const float* inp, size_t n) {
  PT_LAUNCH(gelu_forward_k, blocks_for(n), 256, 0, out, inp, n);
}
void bias_gelu_forward(float* out, const float* pre, const float* bias, int N, int C) {
  const size_t n = static_cast<size_t>(N) * C;
  PT_LAUNCH(bias_gelu_forward_k, blocks_for(n), 256, 0, out, pre, bias, C, n);
}
void bias_gelu_backward(float* dinp, float* dbias, const float* pre, const float* bias, const float* dout, int N,
                        int C) {
  const size_t n = static_cast<size_t>(N) * C;
  PT_LAUNCH(bias_gelu_backward_k, blocks_for(n), 256, 0, dinp, pre, bias, C, dout, n);
  if (dbias) column_sum_add(dbias, N, C, Element{dinp, C}, 0);
}
void residual_forward(float* out, const float* a, const float* b, const float* bias, int N, int C) {
  const size_t n = static_cast<size_t>(N) * C;
  PT_LAUNCH(residual_forward_k, blocks_for(n), 256, 0, out, a, b, bias, C, n);
}

double softmax_crossentropy_forward(float* probs, const float* logits, const int* targets, int N, int V) {
  double* row_loss = static_cast<double*>(scratch(0, sizeof(double) * N));
  PT_LAUNCH(softmax_crossentropy_forward_k, N, 256, 0, probs, row_loss, logits, targets, V);
  return sum_rows_in_order(row_loss, N);
}
void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float scale, int N, int V,
                                   int v_begin) {
  const size_t n = static_cast<size_t>(N) * V;
  PT_LAUNCH(softmax_crossentropy_backward_k, blocks_for(n), 256, 0, dlogits, probs, targets, scale, V, v_begin, n);
}

void adamw_update(float* w, const float* grad, float* m, float* v, size_t n, float beta1, float beta2, float step_size,
                  float inv_sqrt_bc2, float eps, float decay, float grad_mul) {
  PT_LAUNCH(adamw_k, blocks_for(n), 256, 0, w, grad, m, v, n, beta1, beta2, step_size, inv_sqrt_bc2, eps, decay,
            grad_mul);
}

double sum_of_squares(const float* x, size_t n) {
  if (n == 0) return 0.0;
  double* partial = static_cast<double*>(scratch(0, sizeof(double) * kSquareBlocks));
  PT_LAUNCH(sum_of_squares_k, kSquareBlocks, 256, 0, partial, x, n);
  std::vector<double> host(kSquareBlocks);
  copy_to_host(host.data(), partial, sizeof(double) * kSquareBlocks);
  double s = 0.0;
  for (double p : host) s += p;
  return s;
}

}  // namespace pipetrain::gpu
