// The mixture-of-experts MLP's kernels (model/stage_moe.cpp runs them), with the layer kernels'
// contract (layer_kernels.hpp: parameter gradients accumulate, input gradients are overwritten
// unless said otherwise). Routing runs on the host; the kernels that move and weigh the rows are
// in the layer kernel list, on either device (kernels.hpp, gpu_kernels.hpp), reading the routing
// as a RoutedSlots on their device.
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
//
// The list's MoE kernels (r: the routing, on the kernel's device):
//   router_softmax_forward: probs [N, E] = softmax(logits) (in place where probs == logits); lse
//     [N] each row's logsumexp.
//   router_backward: dlogits [N, E] from the combine weights' gradient dweight [N, k] (null:
//     none), through the renormalisation and the softmax, plus aux_scale x d(aux)/d(logits) and
//     z_scale x d(z)/d(logits) (each scale: the loss's coefficient times dLoss/d(the
//     micro-batch's term)).
//   moe_gather: xs [rows, C], each row's token's x [N, C].
//   moe_combine_forward: out [N, C] = (accumulate ? out : 0) + the sum over a token's kept slots,
//     in slot order, of weight x y[row] (y [rows, C]).
//   moe_combine_backward: dy [rows, C] = weight x dout[token] (null: not wanted); dweight [N, k] =
//     dout[token] . y[row], 0 where dropped (null: not wanted).
//   moe_scatter_add: dx [N, C] += the sum of each token's rows of dxs [rows, C], in slot order.
//   The shared experts' gate (Qwen-MoE's): shared_gate_forward turns gate [N], each token's logit
//     x . w, into its sigmoid and writes out [N, C] = gate_t x shared[t]; shared_gate_backward
//     writes dshared [N, C] = gate_t x dout[t] and dgate [N] = dout[t] . shared[t] (the sigmoid
//     output's gradient; under tensor ranks a partial, shared being one; null: not wanted);
//     sigmoid_backward then writes dlogit [N] = dgate x gate (1 - gate).
#pragma once
#include <cstddef>
#include <vector>

#include "pipetrain/compute/array.hpp"
#include "pipetrain/compute/ops.hpp"
#include "pipetrain/compute/routed_slots.hpp"

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
  size_t bytes() const;          // what its arrays hold: moe_routing_bytes(N, k, E) once routed
  operator RoutedSlots() const;  // its arrays as the CPU's kernels read them
};
size_t moe_routing_bytes(int N, int k, int E);

// An expert's capacity under `factor` (0: dropless, every slot kept).
int moe_capacity(double factor, int N, int E, int k);
// Routes N tokens by their probabilities [N, E].
void moe_route(MoeRouting& r, const float* probs, int N, int E, int k, bool norm_topk, int capacity);

struct RouterLosses {
  double aux = 0, z = 0;
};
RouterLosses router_losses(const float* probs, const float* lse, const MoeRouting& r);

// The routing's arrays on the compute device, for the kernels to read (on the CPU the routing's
// own; on the GPU a copy uploaded by `of`, valid until its next call).
class RoutedSlotsCopy {
 public:
  RoutedSlots of(const MoeRouting& r);

 private:
  Array<int> ints_;  // expert, row, token, chosen
  Array<float> weights_;
};

// Grouped matrix products through `k`'s matmul: for each expert e, out[rows of e, OC] = inp[rows
// of e, C] W_e^T, W_e the e-th [OC, C] of weight [E x OC, C]; offsets [E + 1] (host memory) as
// MoeRouting's. Backward: dinp overwritten (null: not wanted), dweight [E x OC, C] accumulated
// (null: not wanted).
void grouped_matmul_forward(const Kernels& k, float* out, const float* inp, const float* weight, const int* offsets,
                            int E, int C, int OC);
void grouped_matmul_backward(const Kernels& k, float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const int* offsets, int E, int C, int OC);

}  // namespace pipetrain
