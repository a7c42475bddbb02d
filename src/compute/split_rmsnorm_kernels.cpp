// The CPU kernels of an RMSNorm over rows whose columns tensor ranks split (model.qk_norm;
// layer_kernels.hpp gives the contract).
#include "pipetrain/compute/kernels.hpp"

#include <cmath>

#include "pipetrain/compute/profile.hpp"
#include "row_chunks.hpp"

namespace pipetrain {

void split_rms_squares(float* ss, const float* x, int N, int width, int x_stride) {
  KernelTimer timer(Kernel::norm);
  parallel_for(N, rows_per_chunk(width), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      const float* xr = x + t * x_stride;
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int c = 0; c < width; ++c) s += static_cast<double>(xr[c]) * xr[c];
      ss[t] = static_cast<float>(s);
    }
  });
}

void split_rms_forward(float* y, float* rstd, const float* x, const float* ss, const float* w, int N, int width,
                       int x_stride, int y_stride, int whole, float eps) {
  KernelTimer timer(Kernel::norm);
  parallel_for(N, rows_per_chunk(width), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      const float r = 1.f / std::sqrt(ss[t] / whole + eps);
      rstd[t] = r;
      const float* xr = x + t * x_stride;
      float* yr = y + t * y_stride;
#pragma omp simd
      for (int c = 0; c < width; ++c) yr[c] = w[c] * xr[c] * r;
    }
  });
}

void split_rms_dots(float* dot, const float* dy, const float* x, const float* w, int N, int width, int x_stride,
                    int y_stride) {
  KernelTimer timer(Kernel::norm);
  parallel_for(N, rows_per_chunk(width), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      const float *d = dy + t * y_stride, *xr = x + t * x_stride;
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int c = 0; c < width; ++c) s += static_cast<double>(w[c]) * d[c] * xr[c];
      dot[t] = static_cast<float>(s);
    }
  });
}

void split_rms_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd,
                        const float* dot, int N, int width, int x_stride, int y_stride, int whole, float share) {
  KernelTimer timer(Kernel::norm);
  if (dw)  // before dx, which may overwrite dy
    reduce_row_chunks(N, rows_per_chunk(width), width, dw, [&](size_t begin, size_t end, float* partial) {
      for (size_t t = begin; t < end; ++t) {
        const float *d = dy + t * y_stride, *xr = x + t * x_stride;
        const float r = rstd[t];
#pragma omp simd
        for (int c = 0; c < width; ++c) partial[c] += d[c] * xr[c] * r;
      }
    });
  if (!dx) return;
  parallel_for(N, rows_per_chunk(width), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      const float *d = dy + t * y_stride, *xr = x + t * x_stride;
      const float r = rstd[t], term = r * r * share * dot[t] / whole;
      float* o = dx + t * y_stride;
#pragma omp simd
      for (int c = 0; c < width; ++c) o[c] = r * (w[c] * d[c] - xr[c] * term);
    }
  });
}

}  // namespace pipetrain
