// CPU fp32 layer kernels, each forward beside its backward (llm.c style).
// Layout: activations are row-major [N, C] with N = batch x time tokens; weights follow PyTorch's
// nn.Linear layout [out_features, in_features]. Every backward ACCUMULATES (+=) into the parameter
// gradients, so they sum over micro-batches for free. Input gradients are OVERWRITTEN (no zeroing
// pass over the activation-gradient buffers), except LayerNorm's, which adds to its dinp: that is
// where the residual branch's gradient already waits.
#pragma once
#include <cstddef>

namespace pipetrain {

// out[N,C] = wte[token] + wpe[t]
void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C);

// LayerNorm over the last dim with eps 1e-5; mean/rstd [N] are kept for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// dinp null: parameter gradients only; dweight null: input gradient only (dbias then unused). The
// two halves give the same bits alone as together (zero-bubble schedules run them apart).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// out[N,OC] = inp[N,C] weight[OC,C]^T + bias[OC] (bias may be null), via cblas_sgemm.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);
// dinp null: weight (and bias) gradients only; dweight null: input gradient only.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

// Causal multi-head self-attention. qkv [B,T,3C] holds q, k, v packed in that order, heads as
// contiguous slices of each; att [B,NH,T,T] keeps the softmax probabilities (zero above the
// diagonal); out [B,T,C]. Scale 1/sqrt(C/NH). Both compute only the causal lower triangle, in
// small register tiles, never the masked scores above the diagonal.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH);

// tanh for the GELU: a rational approximation within a few ulps of std::tanh, vectorisable.
float fast_tanh(float x);
// exp for the softmaxes: within 2 ulps of std::exp, vectorisable; clamps below at ~1e-38.
float fast_exp(float x);

// GELU, tanh approximation.
void gelu_forward(float* out, const float* inp, size_t n);
// The MLP's bias and GELU in one pass: pre[N,C] += bias (kept: backward needs it), out = gelu(pre).
void bias_gelu_forward(float* pre, float* out, const float* bias, int N, int C);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

// out[N,C] = a + b + bias: a residual add with the branch's output-projection bias folded in.
void residual_forward(float* out, const float* a, const float* b, const float* bias, int N, int C);

// probs = softmax(logits) row-wise; returns the summed token loss sum_i -log probs[i, target_i].
double softmax_crossentropy_forward(float* probs, const float* logits, const int* targets, int N, int V);
// dlogits = (probs - onehot(target)) * scale  (overwrites; scale = dLoss/dtoken-loss).
void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float scale, int N,
                                   int V);

// sgemm rate this process reaches on n x n x n products (best of repeats for ~`seconds`), in
// GFLOP/s: the peak MFU is measured against when log.peak_gflops is 0.
double measure_sgemm_gflops(int n = 256, double seconds = 0.05);
// Seconds for `reps` products of n x n matrices, one after the other: a fixed amount of work.
double time_sgemms(int n, int reps);

}  // namespace pipetrain
