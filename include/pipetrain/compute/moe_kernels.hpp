// The CPU kernels of a mixture-of-experts MLP (model/stage_moe.cpp runs them), forward beside
// backward, with the layer kernels' contract (layer_kernels.hpp: parameter gradients accumulate,
// input gradients are overwritten unless said otherwise).
//
// A micro-batch's N tokens each go to top_k of E experts. The router's logits [N, E] become
// probabilities by a softmax; a token's top_k largest (ties to the lower expert) are its slots,
// weighted by their probabilities, renormalised to sum to 1 where norm_topk. The slots' rows are
// laid out expert after expert, each expert's in token order (MoeRouting): the experts' SwiGLUs
// are then grouped matrix products over each expert's rows, and the weighted combine adds a
// token's rows back. With a capacity, an expert keeps its first `capacity` slots in token order;
// a dropped slot adds nothing.
//
// The router's two losses (each MoE block's, per micro-batch): the load-balancing loss
// aux = E sum_e f_e P_e, f_e the slots choosing e per token (before any drop; sum_e f_e = top_k)
// and P_e the mean probability of e; and the z-loss z = mean_t logsumexp(logits_t)^2.
#pragma once
#include <cstddef>
#include <vector>

namespace pipetrain {

struct MoeRouting {
  int N = 0, k = 0, E = 0;
  std::vector<int> expert;    // [N, k] each slot's expert
  std::vector<float> weight;  // [N, k] its weight in the combine
  std::vector<int> row;       // [N, k] its row among the experts' rows; -1 where capacity dropped it
  std::vector<int> token;     // [rows()] each row's token
  std::vector<int> offsets;   // [E + 1] expert e's rows are [offsets[e], offsets[e + 1])
  std::vector<int> chosen;    // [E] slots choosing e, kept or dropped
  int rows() const { return offsets.empty() ? 0 : offsets[E]; }
  int dropped() const { return N * k - rows(); }
  size_t bytes() const;  // what its arrays hold: moe_routing_bytes(N, k, E) once routed
};
size_t moe_routing_bytes(int N, int k, int E);

// An expert's capacity under `factor` (0: dropless, every slot kept).
int moe_capacity(double factor, int N, int E, int k);
// Routes N tokens by their probabilities [N, E].
void moe_route(MoeRouting& r, const float* probs, int N, int E, int k, bool norm_topk, int capacity);

// probs [N, E] = softmax(logits) (in place where probs == logits); lse [N] each row's logsumexp.
void router_softmax_forward(float* probs, float* lse, const float* logits, int N, int E);
// dlogits [N, E] from the combine weights' gradient dweight [N, k] (null: none), through the
// renormalisation and the softmax, plus aux_scale x d(aux)/d(logits) and z_scale x d(z)/d(logits)
// (each scale: the loss's coefficient times dLoss/d(the micro-batch's term)).
void router_backward(float* dlogits, const float* dweight, const float* probs, const float* lse, const MoeRouting& r,
                     bool norm_topk, float aux_scale, float z_scale);
struct RouterLosses {
  double aux = 0, z = 0;
};
RouterLosses router_losses(const float* probs, const float* lse, const MoeRouting& r);

// xs [rows, C]: each row's token's x [N, C].
void moe_gather(float* xs, const float* x, const MoeRouting& r, int C);
// out [N, C] = (accumulate ? out : 0) + sum over a token's kept slots of weight x y[row] (y [rows, C]).
void moe_combine_forward(float* out, const float* y, const MoeRouting& r, int C, bool accumulate);
// dy [rows, C] = weight x dout[token] (null: not wanted); dweight [N, k] = dout[token] . y[row], 0
// where dropped (null: not wanted).
void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y, const MoeRouting& r, int C);
// dx [N, C] += the sum of each token's rows of dxs [rows, C], in slot order.
void moe_scatter_add(float* dx, const float* dxs, const MoeRouting& r, int C);

// The shared experts' gate (Qwen-MoE's): gate [N] holds each token's logit x . w in and its sigmoid
// out; out [N, C] = gate_t x shared[t]. Backward: dshared [N, C] = gate_t x dout[t], dgate [N] =
// dout[t] . shared[t] (the sigmoid output's gradient; under tensor ranks a partial, shared being
// one; null: not wanted); then dlogit [N] = dgate x gate (1 - gate).
void shared_gate_forward(float* out, float* gate, const float* shared, int N, int C);
void shared_gate_backward(float* dshared, float* dgate, const float* dout, const float* shared, const float* gate,
                          int N, int C);
void sigmoid_backward(float* dlogit, const float* dgate, const float* gate, int N);

// Grouped matrix products: for each expert e, out[rows of e, OC] = inp[rows of e, C] W_e^T, W_e
// the e-th [OC, C] of weight [E x OC, C]; offsets [E + 1] as MoeRouting's. Backward: dinp
// overwritten (null: not wanted), dweight [E x OC, C] accumulated (null: not wanted).
void grouped_matmul_forward(float* out, const float* inp, const float* weight, const int* offsets, int E, int C,
                            int OC);
void grouped_matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                             const int* offsets, int E, int C, int OC);

}  // namespace pipetrain
