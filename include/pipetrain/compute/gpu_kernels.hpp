// GPU layer kernels: the CPU kernels of kernels.hpp with the same arguments and the same contract
// (parameter gradients accumulate, input gradients are overwritten except LayerNorm's, null dinp /
// dweight for one half of a backward), on device pointers, on the rank's compute stream. Tests
// compare each with its CPU twin (tests/gpu).
//
// Determinism: every reduction runs in a fixed order for a given shape, except the token-embedding
// gradient, which scatters with atomicAdd (rows repeat whenever a token does).
#pragma once
#include <cstddef>

#include "pipetrain/config/choices.hpp"  // Dtype

namespace pipetrain::gpu {

// Matrix products take fp32 inputs and weights. bf16: both are rounded to bfloat16 on the way
// into cuBLAS (fp32 accumulation and output, fp32 master weights untouched); fp32: plain SGEMM
// (TF32 tensor cores off).
void set_matmul_dtype(Dtype dtype);

void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C);

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH);

void gelu_forward(float* out, const float* inp, size_t n);
void bias_gelu_forward(float* pre, float* out, const float* bias, int N, int C);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);
void residual_forward(float* out, const float* a, const float* b, const float* bias, int N, int C);

// Returns the summed token loss; waits for the stream (the loss comes back to the host).
double softmax_crossentropy_forward(float* probs, const float* logits, const int* targets, int N, int V);
void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float scale, int N,
                                   int V);

// One AdamW update of n values as AdamW::step does for one tensor: g = grad * grad_mul,
// m, v moments, w *= decay, w -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps).
void adamw_update(float* w, const float* grad, float* m, float* v, size_t n, float beta1, float beta2,
                  float step_size, float inv_sqrt_bc2, float eps, float decay, float grad_mul);

// Sum of squares of n values, accumulated in double in a fixed order (the gradient norm).
double sum_of_squares(const float* x, size_t n);

// GEMM rate of this GPU on n x n x n products in the current matmul dtype (GFLOP/s, best of
// repeats for ~`seconds`): MFU's denominator when log.peak_gflops is 0.
double measure_gemm_gflops(int n = 4096, double seconds = 0.2);
// Seconds for `reps` n x n x n products queued back to back, until the last has finished.
double time_gemms(int n, int reps);

}  // namespace pipetrain::gpu
