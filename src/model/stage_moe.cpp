// An MoE block's MLP (model.moe), forward beside backward: the router, the routed experts as
// grouped products over each expert's rows, the weighted combine, the shared experts, and the
// router's load-balancing and z losses (moe_kernels.hpp). Its input is ln2's whole rows and its
// output the MLP's [N, C] before the residual, as the dense MLP's in stage_layers.cpp.
//
// Tensor ranks: each holds its part of every expert's (and the shared experts') hidden width, so
// its expert outputs and MLP output are partial sums, summed over the group with the dense MLP's
// (sum_partials). The router is whole on every rank and routes alike; the combine weights'
// gradients, dot products with the partial outputs, are summed over the group (Exchange::route).
// The router's input gradient is added on the group's first rank only, as the group then sums it
// (every rank computes it: the router is a small product, replicated as its forward is). A
// shared-expert gate (Qwen-MoE's) is whole on every rank as the router is: it scales the shared
// experts' partial output, and its gradient, a dot product with that partial, is summed with the
// combine weights'.
//
// Routing is recomputed from the kept router probabilities in each pass (it is cheap, and the
// stage's one MoeRouting serves block after block). It runs on the host: its row counts size the
// grouped products and the all-to-alls, so on the GPU the probabilities [N, E] come down, and the
// routing goes up for the kernels that move the rows (RoutedSlotsCopy).
//
// Expert ranks (expert_parallel.hpp): each holds held_experts of them. The rows the routing lays
// out go to their experts' ranks before the experts' products and come back after (forward: the
// input rows out, the outputs back; backward: the outputs' gradients out, the inputs' back), so the
// experts' buffers (fch, fch_gelu, dfch and the rows in routed_in and routed_grad) hold the rows
// this rank's experts run, grown to what arrives. Everything else (router, combine, shared
// experts, losses) stays with the tokens. A pass that needs the experts' rows again (the weight
// half of a split backward) sends them again: every rank of the group runs the same passes in the
// same order, so their all-to-alls pair up.
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/moe_kernels.hpp"
#include "pipetrain/model/model.hpp"

namespace pipetrain {

void Stage::route(const BlockActs& a, int N) {
  const BlockShape& s = moe_shape_;
  const float* probs = a.router.data();
  if (a.router.on_gpu()) {
    routed_by_.resize(static_cast<size_t>(N) * s.experts);
    download(routed_by_.data(), probs, sizeof(float) * routed_by_.size());
    probs = routed_by_.data();
  }
  moe_route(routing_, probs, N, s.experts, s.top_k, moe_.norm_topk,
            moe_capacity(moe_.capacity_factor, N, s.experts, s.top_k));
  slots_ = slots_copy_.of(routing_);
}

void Stage::send_to_experts(Floats& buf, int width, bool planned) {
  if (ep_.size == 1) return;
  if (!planned) dispatch_.plan(routing_, moe_shape_.held_experts, *experts_);
  dispatch_.send(buf.data(), buf, width, *experts_, scratch_.exchanged);
}

void Stage::back_from_experts(Floats& buf, int width) {
  if (ep_.size > 1) dispatch_.bring_back(buf.data(), buf, width, *experts_, scratch_.exchanged);
}

void Stage::moe_forward(BlockActs& a, const BlockPtrs& w, const float* x, float* out, int N, int block) {
  const BlockShape& s = moe_shape_;
  const int C = C_, E = s.experts;
  k_.matmul_forward(a.router.data(), x, w.routerw, nullptr, N, C, E);
  k_.router_softmax_forward(a.router.data(), a.router_lse.data(), a.router.data(), N, E);
  route(a, N);
  if (recording_routes_) record_routes(block, a);
  const bool shared = s.shared_ffn > 0;
  if (shared) {  // the always-on experts first, into out (through their gate where they have one)
    k_.matmul_forward(a.shared_fch.data(), x, w.sharedw, nullptr, N, C, 2 * s.shared_ffn);
    k_.swiglu_forward(a.shared_act.data(), a.shared_fch.data(), N, s.shared_ffn);
    k_.matmul_forward(s.shared_gate ? a.shared_out.data() : out, a.shared_act.data(), w.sharedprojw, nullptr, N,
                      s.shared_ffn, C);
    if (s.shared_gate) {
      k_.matmul_forward(a.shared_gate.data(), x, w.sharedgatew, nullptr, N, C, 1);
      k_.shared_gate_forward(out, a.shared_gate.data(), a.shared_out.data(), N, C);
    }
    poll();
  }
  k_.moe_gather(scratch_.routed_in.data(), x, slots_, C);
  send_to_experts(scratch_.routed_in, C);
  const int rows = expert_rows(), held = s.held_experts;
  ensure_size(a.fch, static_cast<size_t>(rows) * s.fc);
  ensure_size(a.fch_gelu, static_cast<size_t>(rows) * s.ffn);
  grouped_matmul_forward(k_, a.fch.data(), scratch_.routed_in.data(), w.fcw, expert_offsets(), held, C, s.fc);
  poll();
  k_.swiglu_forward(a.fch_gelu.data(), a.fch.data(), rows, s.ffn);
  Floats& y = ep_.size > 1 ? scratch_.routed_grad : a.expert_out;  // the experts' outputs, then with their tokens
  ensure_size(y, static_cast<size_t>(rows) * C);
  grouped_matmul_forward(k_, y.data(), a.fch_gelu.data(), w.fcprojw, expert_offsets(), held, s.ffn, C);
  poll();
  if (ep_.size > 1) dispatch_.bring_back(y.data(), a.expert_out, C, *experts_, scratch_.exchanged);
  k_.moe_combine_forward(out, a.expert_out.data(), slots_, C, shared);
}

// dout: the MLP output's gradient, whole rows; ln2: the rows of its input this rank keeps; dx:
// where the partial gradient of the input goes (overwritten). With `g` the parameter gradients are
// added too (the input's whole rows gathered once dout has been read: sequence parallelism gathers
// both into one buffer); without, what the weight half needs is left in w (dfch, drouter,
// dshared_fch; the caller keeps dout).
void Stage::moe_backward_input(const BlockActs& a, BlockWGrads& w, const BlockPtrs* g, const BlockPtrs& p,
                               const float* dout, const float* ln2, float* dx, int N) {
  const BlockShape& s = moe_shape_;
  const int C = C_, E = s.experts, k = s.top_k, held = s.held_experts;
  auto grad = [&](float* BlockPtrs::*field) { return g ? g->*field : nullptr; };
  route(a, N);
  // The combine: each row's gradient, and each slot's weight's; with a shared-expert gate its
  // output's gradient after them (all summed over the tensor group at once).
  float* dweight = scratch_.droute_weight.data();
  float* dgate = dweight + static_cast<size_t>(N) * k;
  k_.moe_combine_backward(scratch_.routed_grad.data(), dweight, dout, a.expert_out.data(), slots_, C);
  const float* shared_dout = dout;
  if (s.shared_gate) {
    k_.shared_gate_backward(scratch_.dshared_out.data(), dgate, dout, a.shared_out.data(), a.shared_gate.data(), N, C);
    shared_dout = scratch_.dshared_out.data();
  }
  if (tp_.size > 1) {
    const size_t floats = static_cast<size_t>(N) * (k + (s.shared_gate ? 1 : 0));
    count_sent(Exchange::route, sizeof(float) * floats);
    group_->sum(dweight, floats);
  }
  const bool shared = s.shared_ffn > 0;
  if (shared) {
    k_.matmul_backward(scratch_.dshared_act.data(), grad(&BlockPtrs::sharedprojw), nullptr, shared_dout,
                       a.shared_act.data(), p.sharedprojw, N, s.shared_ffn, C);
    k_.swiglu_backward(w.dshared_fch.data(), a.shared_fch.data(), scratch_.dshared_act.data(), N, s.shared_ffn);
  }
  const float* x = whole_rows_if(g, ln2, N);
  // The experts, down then gate | up; the rows' input gradients end in routed_grad, back with
  // their tokens.
  send_to_experts(scratch_.routed_grad, C);
  const int rows = expert_rows();
  ensure_size(scratch_.dfch_gelu, static_cast<size_t>(rows) * s.ffn);
  ensure_size(w.dfch, static_cast<size_t>(rows) * s.fc);
  grouped_matmul_backward(k_, scratch_.dfch_gelu.data(), grad(&BlockPtrs::fcprojw), scratch_.routed_grad.data(),
                          a.fch_gelu.data(), p.fcprojw, expert_offsets(), held, s.ffn, C);
  poll();
  k_.swiglu_backward(w.dfch.data(), a.fch.data(), scratch_.dfch_gelu.data(), rows, s.ffn);
  if (g) {
    k_.moe_gather(scratch_.routed_in.data(), x, slots_, C);
    send_to_experts(scratch_.routed_in, C, true);
  }
  grouped_matmul_backward(k_, scratch_.routed_grad.data(), grad(&BlockPtrs::fcw), w.dfch.data(),
                          g ? scratch_.routed_in.data() : nullptr, p.fcw, expert_offsets(), held, C, s.fc);
  poll();
  back_from_experts(scratch_.routed_grad, C);
  // The shared experts write dx, else it starts at 0; the rows' gradients are added to their tokens.
  if (shared)
    k_.matmul_backward(dx, grad(&BlockPtrs::sharedw), nullptr, w.dshared_fch.data(), x, p.sharedw, N, C,
                       2 * s.shared_ffn);
  else zero_values(dx, static_cast<size_t>(N) * C);
  k_.moe_scatter_add(dx, scratch_.routed_grad.data(), slots_, C);
  // The router: its logits' gradient (the combine's, the losses'), then its input's (first rank).
  const float scale = grad_scale_ * static_cast<float>(B_) * T_;  // dLoss/d(a micro-batch's router loss)
  k_.router_backward(w.drouter.data(), dweight, a.router.data(), a.router_lse.data(), slots_, moe_.norm_topk,
                     static_cast<float>(moe_.aux_loss) * scale, static_cast<float>(moe_.z_loss) * scale);
  float* router_dx = scratch_.routed_in.data();  // free again; every rank computes it, as it did the logits
  k_.matmul_backward(router_dx, grad(&BlockPtrs::routerw), nullptr, w.drouter.data(), x, p.routerw, N, C, E);
  if (tp_.rank == 0) k_.residual_forward(dx, dx, router_dx, nullptr, N, C);
  if (!s.shared_gate) return;
  k_.sigmoid_backward(w.dshared_gate.data(), dgate, a.shared_gate.data(), N);  // the gate's logit, likewise
  float* gate_dx = scratch_.dshared_out.data();                                // free again
  k_.matmul_backward(gate_dx, grad(&BlockPtrs::sharedgatew), nullptr, w.dshared_gate.data(), x, p.sharedgatew, N, C, 1);
  if (tp_.rank == 0) k_.residual_forward(dx, dx, gate_dx, nullptr, N, C);
}

void Stage::moe_backward_weight(const BlockActs& a, const BlockWGrads& w, const BlockPtrs& g, const float* x, int N) {
  const BlockShape& s = moe_shape_;
  const int C = C_, E = s.experts, held = s.held_experts;
  route(a, N);
  k_.moe_combine_backward(scratch_.routed_grad.data(), nullptr, w.dout.data(), nullptr, slots_, C);
  send_to_experts(scratch_.routed_grad, C);
  grouped_matmul_backward(k_, nullptr, g.fcprojw, scratch_.routed_grad.data(), a.fch_gelu.data(), nullptr,
                          expert_offsets(), held, s.ffn, C);
  poll();
  k_.moe_gather(scratch_.routed_in.data(), x, slots_, C);
  send_to_experts(scratch_.routed_in, C, true);
  grouped_matmul_backward(k_, nullptr, g.fcw, w.dfch.data(), scratch_.routed_in.data(), nullptr, expert_offsets(), held,
                          C, s.fc);
  poll();
  if (s.shared_ffn > 0) {
    const float* shared_dout = w.dout.data();
    if (s.shared_gate) {  // the gated output's gradient again
      k_.shared_gate_backward(scratch_.dshared_out.data(), nullptr, w.dout.data(), nullptr, a.shared_gate.data(), N, C);
      shared_dout = scratch_.dshared_out.data();
      k_.matmul_backward(nullptr, g.sharedgatew, nullptr, w.dshared_gate.data(), x, nullptr, N, C, 1);
    }
    k_.matmul_backward(nullptr, g.sharedprojw, nullptr, shared_dout, a.shared_act.data(), nullptr, N, s.shared_ffn, C);
    k_.matmul_backward(nullptr, g.sharedw, nullptr, w.dshared_fch.data(), x, nullptr, N, C, 2 * s.shared_ffn);
  }
  k_.matmul_backward(nullptr, g.routerw, nullptr, w.drouter.data(), x, nullptr, N, C, E);
}

void Stage::record_routes(int block, const BlockActs& a) {
  MoeBlockFigures& f = moe_figures_[block];
  f.chosen.resize(routing_.E);
  for (int e = 0; e < routing_.E; ++e) f.chosen[e] += routing_.chosen[e];
  f.dropped += routing_.dropped();
  const float* probs = a.router.on_gpu() ? routed_by_.data() : a.router.data();  // route()'s, just made
  const std::vector<float> lse = a.router_lse.to_host();
  const RouterLosses losses = router_losses(probs, lse.data(), routing_);
  f.aux_loss += losses.aux;
  f.z_loss += losses.z;
  f.micro_batches += 1;
}

}  // namespace pipetrain
