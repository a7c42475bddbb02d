// CPU fp32 layer kernels (layer_kernels.hpp: the list and its contract), each forward beside its
// backward in kernels.cpp (llm.c style). Matrix products go through cblas_sgemm; attention
// (attention.cpp) runs in blocks with an online softmax and keeps no T x T matrix.
#pragma once
#include <cstddef>

#include "pipetrain/compute/fast_math.hpp"  // fast_exp, fast_tanh
#include "pipetrain/compute/layer_kernels.hpp"

namespace pipetrain {

PIPETRAIN_LAYER_KERNELS(PIPETRAIN_DECLARE_KERNEL)

// Causal attention for n new tokens of one sequence at positions pos .. pos+n-1 (generation with a
// KV cache): qkv [n, C + 2 KV] as attention_forward's; their keys and values are written into
// k_cache and v_cache at rows pos .. pos+n-1 ([positions, KV] each: only the NKV key/value heads),
// and out [n, C] attends over rows doc_start[i] .. own (doc_start: null, or n absolute positions).
void attention_forward_cached(float* out, const float* qkv, float* k_cache, float* v_cache, int pos, int n, int C,
                              int NH, int NKV, const int* doc_start);

// Whether attention's products may run AVX-512 tiles (on, the default, where the CPU has AVX-512)
// or only the AVX2 ones: the same bits either way; for the test that holds them to it and for
// benchmarks.
void set_wide_attention_tiles(bool on);

// Bytes of scratch one compute thread keeps for attention_forward/backward at sequence length T,
// head size hs and `group` query heads per key/value head: O(T), never T x T.
size_t attention_scratch_bytes(int T, int hs, int group);

// dbias[OC] += the sum of dout[N,OC]'s rows (matmul_backward's bias part, on either product type).
void bias_backward(float* dbias, const float* dout, int N, int OC);

// GELU, tanh approximation (the layer list's bias_gelu_forward without the bias).
void gelu_forward(float* out, const float* inp, size_t n);

// sgemm rate this process reaches on n x n x n products (best of repeats for ~`seconds`), in
// GFLOP/s: the peak MFU is measured against when log.peak_gflops is 0.
double measure_sgemm_gflops(int n = 256, double seconds = 0.05);
// Seconds for `reps` products of n x n matrices, one after the other: a fixed amount of work.
double time_sgemms(int n, int reps);

}  // namespace pipetrain
