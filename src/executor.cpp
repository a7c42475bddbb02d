#include "pipetrain/executor.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "pipetrain/clock.hpp"

namespace pipetrain {
namespace {

int act_tag(int mb) { return 2 * mb; }
int grad_tag(int mb) { return 2 * mb + 1; }

}  // namespace

Executor::Executor(Stage& stage, Comm& comm) : stage_(stage), comm_(comm) {
  const size_t n = stage.boundary_floats();
  for (SendRing* r : {&act_out_, &grad_out_}) {
    r->bufs.assign(kRing, std::vector<float>(n));
    r->reqs.assign(kRing, MPI_REQUEST_NULL);
    r->mb.assign(kRing, -1);
  }
  grad_in_.assign(kRing, std::vector<float>(n));
  grad_in_req_.assign(kRing, MPI_REQUEST_NULL);
}

float* Executor::SendRing::acquire(Comm& comm, int for_mb, const char* what, int peer, Trace& trace) {
  const size_t slot = next++ % kRing;
  const double t0 = now_s();
  comm.wait(reqs[slot], {what, peer, mb[slot]});  // the earlier send from this buffer
  if (mb[slot] >= 0) trace.span(std::string("wait ") + what + " " + std::to_string(mb[slot]), "wait", t0, now_s(), mb[slot]);
  mb[slot] = for_mb;
  return bufs[slot].data();
}

size_t Executor::SendRing::slot_of(int for_mb) const {
  for (size_t s = 0; s < kRing; ++s)
    if (mb[s] == for_mb) return s;
  throw std::logic_error("schedule sends micro-batch " + std::to_string(for_mb) + " before computing it");
}

void Executor::SendRing::drain(Comm& comm, const char* what, int peer) {
  for (size_t s = 0; s < kRing; ++s) comm.wait(reqs[s], {what, peer, mb[s]}), mb[s] = -1;  // none stale next step
}

StepStats Executor::run(const ActionList& actions, int micro_batches, Trace& trace,
                        const std::function<void(size_t)>& grads_done_from) {
  const Action* last_backward = nullptr;
  for (const Action& a : actions)
    if (a.op == Op::backward) last_backward = &a;
  StepStats st;
  const double wait0 = comm_.wait_seconds();
  const size_t n = stage_.boundary_floats();
  const int prev = comm_.topo().stage - 1, next = comm_.topo().stage + 1;

  // Activation bytes held, counted from the stage's buffers after every change.
  std::vector<size_t> held(micro_batches, 0);
  size_t total = 0;
  auto update = [&](int mb) {
    size_t b = stage_.stash_bytes(mb);
    total = total + b - held[mb];
    held[mb] = b;
    st.act_peak_bytes = std::max(st.act_peak_bytes, total);
  };

  std::vector<MPI_Request> act_in(micro_batches, MPI_REQUEST_NULL);
  std::vector<int> grad_order;
  for (const Action& a : actions) {
    if (a.op == Op::recv_act) act_in[a.mb] = comm_.irecv(stage_.input_buffer(a.mb), n, prev, act_tag(a.mb));
    if (a.op == Op::recv_grad) grad_order.push_back(a.mb);
  }
  for (int mb = 0; mb < micro_batches; ++mb) update(mb);

  size_t grads_posted = 0, grads_used = 0;
  auto post_grad_recvs = [&] {
    for (; grads_posted < grad_order.size() && grads_posted < grads_used + kRing; ++grads_posted) {
      size_t slot = grads_posted % kRing;
      grad_in_req_[slot] = comm_.irecv(grad_in_[slot].data(), n, next, grad_tag(grad_order[grads_posted]));
    }
  };
  post_grad_recvs();

  float* act_out = nullptr;
  float* grad_out = nullptr;
  const float* grad_in = nullptr;
  int grad_in_mb = -1;
  for (const Action& a : actions) {
    switch (a.op) {
      case Op::recv_act: {
        const double t0 = now_s();
        comm_.wait(act_in[a.mb], {"recv activation", prev, a.mb});
        trace.span("wait " + to_string(a), "wait", t0, now_s(), a.mb);
        break;
      }
      case Op::forward: {
        if (!stage_.last()) act_out = act_out_.acquire(comm_, a.mb, "send activation", next, trace);
        const double t0 = now_s();
        st.loss_sum += stage_.forward(a.mb, act_out);
        const double t1 = now_s();
        st.compute_s += t1 - t0;
        trace.span(to_string(a), "forward", t0, t1, a.mb);
        update(a.mb);
        break;
      }
      case Op::send_act: {
        const size_t slot = act_out_.slot_of(a.mb);
        act_out_.reqs[slot] = comm_.isend(act_out_.bufs[slot].data(), n, next, act_tag(a.mb));
        break;
      }
      case Op::recv_grad: {
        size_t slot = grads_used % kRing;
        const double t0 = now_s();
        comm_.wait(grad_in_req_[slot], {"recv gradient", next, a.mb});
        trace.span("wait " + to_string(a), "wait", t0, now_s(), a.mb);
        grad_in = grad_in_[slot].data();
        grad_in_mb = a.mb;
        break;
      }
      case Op::backward: {
        if (!stage_.first()) grad_out = grad_out_.acquire(comm_, a.mb, "send gradient", prev, trace);
        if (!stage_.last() && grad_in_mb != a.mb)
          throw std::logic_error("schedule runs backward of micro-batch " + std::to_string(a.mb) +
                                 " without receiving its gradient first");
        const double t0 = now_s();
        stage_.backward(a.mb, grad_in, grad_out, &a == last_backward ? grads_done_from : nullptr);
        const double t1 = now_s(), rs = stage_.last_recompute_s();
        st.compute_s += t1 - t0;
        // Recompute shown first; under recompute = block it is really interleaved block by block.
        if (rs > 0) trace.span("R" + std::to_string(a.mb), "recompute", t0, t0 + rs, a.mb);
        trace.span(to_string(a), "backward", t0 + rs, t1, a.mb);
        update(a.mb);
        if (!stage_.last()) {
          ++grads_used;  // its receive buffer is free again
          post_grad_recvs();
        }
        break;
      }
      case Op::send_grad: {
        const size_t slot = grad_out_.slot_of(a.mb);
        grad_out_.reqs[slot] = comm_.isend(grad_out_.bufs[slot].data(), n, prev, grad_tag(a.mb));
        break;
      }
    }
  }
  const double t0 = now_s();
  act_out_.drain(comm_, "send activation", next);
  grad_out_.drain(comm_, "send gradient", prev);
  trace.span("wait sends", "wait", t0, now_s());
  st.wait_s = comm_.wait_seconds() - wait0;
  return st;
}

}  // namespace pipetrain#include "pipetrain/clock.hpp"

