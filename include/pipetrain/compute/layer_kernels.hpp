// The layer kernels, listed once: the CPU declares them (kernels.hpp), the GPU declares them in
// pipetrain::gpu (gpu_kernels.hpp), a build without CUDA stubs them (cuda/none.cpp), and the
// table Stage calls them through is made from the same list (ops.hpp, ops.cpp).
//
// Contract, on either device. Activations are row-major [N, C] with N = batch x time tokens;
// weights follow PyTorch's nn.Linear layout [out_features, in_features]. Every backward ACCUMULATES
// (+=) into the parameter gradients, so they sum over micro-batches for free. Input gradients are
// OVERWRITTEN (no zeroing pass), except LayerNorm's, which adds to its dinp: that is where the
// residual branch's gradient already waits. A null dinp asks a backward for the parameter
// gradients only, a null dweight for the input gradient only; the two halves give the same bits
// alone as together (zero-bubble schedules run them apart).
//
//   Document masking (data.document_mask): doc_start [B,T] gives each row the first position of
//     its document in its sequence (doc_start[t] <= t, never decreasing along a sequence); pos
//     [B,T] each row's position (t - doc_start[t] where positions restart per document). Either
//     may be null: one document per sequence (doc_start 0), position t.
//   encoder: out[N,C] = wte[token - v_begin] + wpe[pos] (wpe may be null: no position table, llama),
//     wte holding vocabulary rows [v_begin, v_begin + v_rows); a token outside them adds nothing
//     (a tensor rank's part of the vocabulary: the group sums the parts). Backward likewise.
//   layernorm: over the last dim with eps 1e-5; mean/rstd [N] are kept for backward.
//   rmsnorm: out = x / sqrt(mean(x^2) + eps) * weight over the last dim; rstd [N] kept for backward.
//     Its backward adds to dinp, as LayerNorm's.
//   matmul: out[N,OC] = inp[N,C] weight[OC,C]^T + bias[OC] (bias may be null).
//   rope: rotary position embeddings, rotate-half convention, applied in place to the q and k heads
//     of qkv [B,T,C+2KV] (rows as attention's): in head dims (i, i + hs/2), i < hs/2, the pair is
//     rotated by angle p theta^(-2i/hs), p = pos[row] where given, else pos0 + t. Backward rotates
//     dq and dk back (dv untouched).
//   attention: causal self-attention with NH query heads and NKV key/value heads (NKV divides NH;
//     query head h reads key/value head h / (NH/NKV), grouped-query attention; NKV = NH is
//     multi-head). qkv [B,T,C+2KV], KV = NKV C/NH, holds q, k, v packed in that order, heads as
//     contiguous slices of each; out [B,T,C]; scale 1/sqrt(C/NH). No T x T matrix is ever kept:
//     lse [B,NH,T] keeps each query row's log-sum-exp of its scaled scores, logsumexp over the keys
//     it sees, doc_start[t] <= u <= t, of scale q_t . k_u, and the backward recomputes the probabilities exp(score -
//     lse) tile by tile from it, with out (the forward's output) giving each row's sum_u p_u dp_u = dout_t . out_t. The
//     backward writes dq, dk and dv (a key/value head's sum over the query heads that read it, in head order); every
//     output is a sum in a fixed order: the same bits on every run and layout.
//   bias_gelu: the MLP's bias and GELU (tanh approximation) in one pass: out[N,C] = gelu(pre + bias),
//     pre (the product's output) left as it is: the backward adds the bias again rather than the
//     forward writing the sum back. Backward writes dinp = gelu'(pre + bias) dout and, where dbias
//     is given (a fused backward), adds dinp's column sums to it in the same pass: the bias
//     gradient, the same bits as the product's bias_backward over dinp, without reading it again.
//   swiglu: out[N,H] = silu(gate) * up, where each row of gate_up [N,2H] is gate then up.
//   residual: out[N,C] = a + b + bias: a residual add with the branch's output-projection bias
//     folded in (bias may be null).
//   softmax_crossentropy: probs = softmax(logits) row-wise; forward returns the summed token loss
//     sum_i -log probs[i, target_i] (the GPU waits for its stream); backward writes
//     dlogits = (probs - onehot(target - v_begin)) * scale, scale = dLoss/dtoken-loss (logits of
//     vocabulary rows from v_begin; a target outside them has no one in the row).
//   vocab_softmax: the same softmax and loss when a tensor rank holds logits [N,V] of vocabulary
//     rows [v_begin, v_begin + V) and the group holds the rest, in three passes with the group's
//     reductions between them: max writes each row's largest logit (then maxed over the group);
//     exp writes probs = exp(logits - row_max) and stats [2N] in double: each row's sum of them,
//     then its target's logit where this rank holds the target, else 0 (both summed over the
//     group); finish divides probs by the sums and returns sum_i log(sum_i) + max_i - target logit_i.
//   The mixture of experts' kernels (router_softmax_forward ... sigmoid_backward): moe_kernels.hpp
//     gives their contract; the routing they read is a RoutedSlots on the kernel's device.
//   split_rms: an RMSNorm over rows whose columns tensor ranks split (model.qk_norm: each token's
//     whole q and whole k, the heads split over the ranks). Each works on this rank's `width`
//     columns of N rows, x's rows `x_stride` floats apart and y's (dy's, dx's) `y_stride` apart;
//     the per-row sums between them are summed over the group by the caller. y = w x r with
//     r = 1 / sqrt(sum(x^2) / whole + eps) over the `whole` row. squares writes ss[t], this rank's
//     sum of x^2; forward writes rstd[t] = r and y; dots writes dot[t], this rank's sum of w dy x;
//     backward adds dw[c] += sum_t dy x rstd (null: not wanted), then writes
//     dx = rstd (w dy - x rstd^2 share dot / whole) (null: not wanted; in place where dx == dy),
//     `share` being this rank's part of the dot's term where several ranks hold the same columns
//     and each a part of dy (a key/value head several hold).
#pragma once
#include <cstddef>

#include "pipetrain/compute/routed_slots.hpp"

// X(return type, name, parameters) for every layer kernel.
#define PIPETRAIN_LAYER_KERNELS(X)                                                                                     \
  X(void, encoder_forward,                                                                                             \
    (float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C, int v_begin, int v_rows,  \
     const int* pos))                                                                                                  \
  X(void, encoder_backward,                                                                                            \
    (float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C, int v_begin, int v_rows,     \
     const int* pos))                                                                                                  \
  X(void, layernorm_forward,                                                                                           \
    (float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, int N, int C))    \
  X(void, layernorm_backward,                                                                                          \
    (float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,              \
     const float* mean, const float* rstd, int N, int C))                                                              \
  X(void, rmsnorm_forward, (float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps))  \
  X(void, rmsnorm_backward,                                                                                            \
    (float* dinp, float* dweight, const float* dout, const float* inp, const float* weight, const float* rstd, int N,  \
     int C))                                                                                                           \
  X(void, matmul_forward,                                                                                              \
    (float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC))                      \
  X(void, matmul_backward,                                                                                             \
    (float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, int N,       \
     int C, int OC))                                                                                                   \
  X(void, rope_forward, (float* qkv, int B, int T, int C, int NH, int NKV, float theta, int pos0, const int* pos))     \
  X(void, rope_backward, (float* dqkv, int B, int T, int C, int NH, int NKV, float theta, int pos0, const int* pos))   \
  X(void, attention_forward,                                                                                           \
    (float* out, float* lse, const float* qkv, int B, int T, int C, int NH, int NKV, const int* doc_start))            \
  X(void, attention_backward,                                                                                          \
    (float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B, int T, int C,        \
     int NH, int NKV, const int* doc_start))                                                                           \
  X(void, bias_gelu_forward, (float* out, const float* pre, const float* bias, int N, int C))                          \
  X(void, bias_gelu_backward,                                                                                          \
    (float* dinp, float* dbias, const float* pre, const float* bias, const float* dout, int N, int C))                 \
  X(void, swiglu_forward, (float* out, const float* gate_up, int N, int H))                                            \
  X(void, swiglu_backward, (float* dgate_up, const float* gate_up, const float* dout, int N, int H))                   \
  X(void, residual_forward, (float* out, const float* a, const float* b, const float* bias, int N, int C))             \
  X(double, softmax_crossentropy_forward, (float* probs, const float* logits, const int* targets, int N, int V))       \
  X(void, softmax_crossentropy_backward,                                                                               \
    (float* dlogits, const float* probs, const int* targets, float scale, int N, int V, int v_begin))                  \
  X(void, vocab_softmax_max, (float* row_max, const float* logits, int N, int V))                                      \
  X(void, vocab_softmax_exp,                                                                                           \
    (float* probs, double* stats, const float* logits, const float* row_max, const int* targets, int N, int V,         \
     int v_begin))                                                                                                     \
  X(double, vocab_softmax_finish, (float* probs, const float* row_max, const double* stats, int N, int V))             \
  X(void, router_softmax_forward, (float* probs, float* lse, const float* logits, int N, int E))                       \
  X(void, router_backward,                                                                                             \
    (float* dlogits, const float* dweight, const float* probs, const float* lse, const RoutedSlots& r, bool norm_topk, \
     float aux_scale, float z_scale))                                                                                  \
  X(void, moe_gather, (float* xs, const float* x, const RoutedSlots& r, int C))                                        \
  X(void, moe_combine_forward, (float* out, const float* y, const RoutedSlots& r, int C, bool accumulate))             \
  X(void, moe_combine_backward,                                                                                        \
    (float* dy, float* dweight, const float* dout, const float* y, const RoutedSlots& r, int C))                       \
  X(void, moe_scatter_add, (float* dx, const float* dxs, const RoutedSlots& r, int C))                                 \
  X(void, shared_gate_forward, (float* out, float* gate, const float* shared, int N, int C))                           \
  X(void, shared_gate_backward,                                                                                        \
    (float* dshared, float* dgate, const float* dout, const float* shared, const float* gate, int N, int C))           \
  X(void, sigmoid_backward, (float* dlogit, const float* dgate, const float* gate, int N))                             \
  X(void, split_rms_squares, (float* ss, const float* x, int N, int width, int x_stride))                              \
  X(void, split_rms_forward,                                                                                           \
    (float* y, float* rstd, const float* x, const float* ss, const float* w, int N, int width, int x_stride,           \
     int y_stride, int whole, float eps))                                                                              \
  X(void, split_rms_dots,                                                                                              \
    (float* dot, const float* dy, const float* x, const float* w, int N, int width, int x_stride, int y_stride))       \
  X(void, split_rms_backward,                                                                                          \
    (float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd, const float* dot,       \
     int N, int width, int x_stride, int y_stride, int whole, float share))

// A declaration of one kernel of the list.
#define PIPETRAIN_DECLARE_KERNEL(ret, name, params) ret name params;
