// The RMSNorm over rows whose columns tensor ranks split (model.qk_norm) on the GPU
// (layer_kernels.hpp has the contract; split_rmsnorm_kernels.cpp is the CPU twin). One warp per
// row for the per-row sums (in double, as the CPU adds them) and the outputs; the weight's
// gradient by column partial sums in a fixed order.
#include <cmath>

#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "reduce.cuh"

namespace pipetrain::gpu {
namespace {

constexpr unsigned kThreads = 256;  // 8 rows a block, one warp each

inline unsigned row_blocks(int N) { return blocks_for(static_cast<size_t>(N) * 32, kThreads); }

// sums[t] = sum over c < width of a[t, c] b[t, c] (w[c] too where given), a's rows a_stride apart
// and b's b_stride.
__global__ void row_sums_k(float* sums, const float* a, const float* b, const float* w, int N, int width, int a_stride,
                           int b_stride) {
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (t >= N) return;
  const float *x = a + static_cast<size_t>(t) * a_stride, *y = b + static_cast<size_t>(t) * b_stride;
  double s = 0;
  for (int c = lane; c < width; c += 32) s += static_cast<double>(w ? w[c] : 1.f) * x[c] * y[c];
  s = warp_sum(s);
  if (lane == 0) sums[t] = static_cast<float>(s);
}

__global__ void forward_k(float* y, float* rstd, const float* x, const float* ss, const float* w, int N, int width,
                          int x_stride, int y_stride, int whole, float eps) {
  const int t = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (t >= N) return;
  const float r = 1.f / sqrtf(ss[t] / whole + eps);
  if (lane == 0) rstd[t] = r;
  const float* xr = x + static_cast<size_t>(t) * x_stride;
  float* yr = y + static_cast<size_t>(t) * y_stride;
  for (int c = lane; c < width; c += 32) yr[c] = w[c] * xr[c] * r;
}

// dx may be dy: each element reads its own dy before writing it.
__global__ void backward_input_k(float* dx, const float* dy, const float* x, const float* w, const float* rstd,
                                 const float* dot, int width, int x_stride, int y_stride, int whole, float share,
                                 size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t t = i / width, c = i % width;
  const float r = rstd[t], term = r * r * share * dot[t] / whole;
  const size_t at = t * y_stride + c;
  dx[at] = r * (w[c] * dy[at] - x[t * x_stride + c] * term);
}

struct NormedGrad {  // dy x rstd, the weight's gradient per row and column
  const float *dy, *x, *rstd;
  int x_stride, y_stride;
  __device__ float operator()(int t, int c) const {
    return dy[static_cast<size_t>(t) * y_stride + c] * x[static_cast<size_t>(t) * x_stride + c] * rstd[t];
  }
};

}  // namespace

void split_rms_squares(float* ss, const float* x, int N, int width, int x_stride) {
  PT_LAUNCH(row_sums_k, row_blocks(N), kThreads, 0, ss, x, x, nullptr, N, width, x_stride, x_stride);
}

void split_rms_forward(float* y, float* rstd, const float* x, const float* ss, const float* w, int N, int width,
                       int x_stride, int y_stride, int whole, float eps) {
  PT_LAUNCH(forward_k, row_blocks(N), kThreads, 0, y, rstd, x, ss, w, N, width, x_stride, y_stride, whole, eps);
}

void split_rms_dots(float* dot, const float* dy, const float* x, const float* w, int N, int width, int x_stride,
                    int y_stride) {
  PT_LAUNCH(row_sums_k, row_blocks(N), kThreads, 0, dot, dy, x, w, N, width, y_stride, x_stride);
}

void split_rms_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd,
                        const float* dot, int N, int width, int x_stride, int y_stride, int whole, float share) {
  if (dw) column_sum_add(dw, N, width, NormedGrad{dy, x, rstd, x_stride, y_stride}, 0);  // before dx overwrites dy
  if (!dx) return;
  const size_t n = static_cast<size_t>(N) * width;
  PT_LAUNCH(backward_input_k, blocks_for(n), 256, 0, dx, dy, x, w, rstd, dot, width, x_stride, y_stride, whole, share,
            n);
}

}  // namespace pipetrain::gpu
