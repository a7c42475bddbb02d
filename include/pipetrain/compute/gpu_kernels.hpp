// GPU layer kernels: the list of layer_kernels.hpp with its contract, on device pointers, on the
// rank's compute stream. Tests compare each with its CPU twin (tests/gpu).
//
// Determinism: every reduction runs in a fixed order for a given shape and no kernel adds floats
// with atomics (the token-embedding gradient sorts the positions by vocabulary row and adds each
// row's in position order; attention's backward sums each output in one block), so a step gives
// the same bits on every run and a resumed run the same as an uninterrupted one. Zero-size work
// (an empty ZeRO-1 slab, no rows) is a no-op in every kernel.
#pragma once
#include <cstddef>

#include "pipetrain/compute/layer_kernels.hpp"
#include "pipetrain/config/choices.hpp"  // Dtype

namespace pipetrain::gpu {

// Matrix products take fp32 inputs and weights; the list's matmul_forward/backward run plain
// SGEMM (TF32 tensor cores off). The _bf16 twins round both to bfloat16 on the way into cuBLAS
// (fp32 accumulation and output, fp32 master weights untouched): the kernel table for
// model.dtype = bf16 holds them (ops.hpp).
PIPETRAIN_LAYER_KERNELS(PIPETRAIN_DECLARE_KERNEL)
void matmul_forward_bf16(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, int N, int C, int OC);
void gelu_forward(float* out, const float* inp, size_t n);

// One AdamW update of n values as AdamW::step does for one tensor: g = grad * grad_mul,
// m, v moments, w *= decay, w -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps).
void adamw_update(float* w, const float* grad, float* m, float* v, size_t n, float beta1, float beta2, float step_size,
                  float inv_sqrt_bc2, float eps, float decay, float grad_mul);

// Sum of squares of n values, accumulated in double in a fixed order (the gradient norm).
double sum_of_squares(const float* x, size_t n);

// GEMM rate of this GPU on n x n x n products with `dtype` inputs (GFLOP/s, best of repeats for
// ~`seconds`): MFU's denominator when log.peak_gflops is 0.
double measure_gemm_gflops(Dtype dtype, int n = 4096, double seconds = 0.2);
// Seconds for `reps` fp32 n x n x n products queued back to back, until the last has finished.
double time_gemms(int n, int reps);

}  // namespace pipetrain::gpu
