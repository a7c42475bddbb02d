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
  for (RecvRing* r : {&act_in_, &grad_in_}) {
    r->bufs.assign(kRing, std::vector<float>(n));
    r->reqs.assign(kRing, MPI_REQUEST_NULL);
  }
}

void Executor::RecvRing::post(Comm& comm, int peer, int (*tag)(int)) {
  for (; posted < order.size() && posted < used + kRing; ++posted) {
    const size_t slot = posted % kRing;
    reqs[slot] = comm.irecv(bufs[slot].data(), bufs[slot].size(), peer, tag(order[posted]));
  }
}

float* Executor::RecvRing::wait(Comm& comm, const WaitLabel& label) {
  const size_t slot = used++ % kRing;
  comm.wait(reqs[slot], label);
  return bufs[slot].data();
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
                        const std::function<void(int)>& load_inputs, const std::function<void(size_t)>& grads_done_from) {
  // The action after which every parameter gradient is final: the data-parallel all-reduce may
  // start during it.
  const Action* last_backward = nullptr;
  for (const Action& a : actions)
    if (a.op == Op::backward || a.op == Op::backward_weight) last_backward = &a;
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

  act_in_.order.clear(), grad_in_.order.clear();
  act_in_.posted = act_in_.used = grad_in_.posted = grad_in_.used = 0;
  for (const Action& a : actions) {
    if (a.op == Op::recv_act) act_in_.order.push_back(a.mb);
    if (a.op == Op::recv_grad) grad_in_.order.push_back(a.mb);
  }
  act_in_.post(comm_, prev, act_tag);
  grad_in_.post(comm_, next, grad_tag);

  float* act_out = nullptr;
  float* grad_out = nullptr;
  const float* grad_in = nullptr;
  int grad_in_mb = -1;
  for (const Action& a : actions) {
    switch (a.op) {
      case Op::recv_act: {
        const double t0 = now_s();
        const float* in = act_in_.wait(comm_, {"recv activation", prev, a.mb});
        trace.span("wait " + to_string(a), "wait", t0, now_s(), a.mb);
        std::copy(in, in + n, stage_.input_buffer(a.mb));  // stashed from here until its backward
        act_in_.post(comm_, prev, act_tag);
        update(a.mb);
        break;
      }
      case Op::forward: {
        if (stage_.first() || stage_.last()) load_inputs(a.mb), update(a.mb);
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
        const double t0 = now_s();
        grad_in = grad_in_.wait(comm_, {"recv gradient", next, a.mb});
        trace.span("wait " + to_string(a), "wait", t0, now_s(), a.mb);
        grad_in_mb = a.mb;
        break;
      }
      case Op::backward:
      case Op::backward_input: {
        if (!stage_.first()) grad_out = grad_out_.acquire(comm_, a.mb, "send gradient", prev, trace);
        if (!stage_.last() && grad_in_mb != a.mb)
          throw std::logic_error("schedule runs backward of micro-batch " + std::to_string(a.mb) +
                                 " without receiving its gradient first");
        const double t0 = now_s();
        if (a.op == Op::backward) stage_.backward(a.mb, grad_in, grad_out, &a == last_backward ? grads_done_from : nullptr);
        else stage_.backward_input(a.mb, grad_in, grad_out);
        const double t1 = now_s(), rs = stage_.last_recompute_s();
        st.compute_s += t1 - t0;
        // Recompute shown first; under recompute = block it is really interleaved block by block.
        if (rs > 0) trace.span("R" + std::to_string(a.mb), "recompute", t0, t0 + rs, a.mb);
        trace.span(to_string(a), "backward", t0 + rs, t1, a.mb);
        update(a.mb);
        if (!stage_.last()) grad_in_.post(comm_, next, grad_tag);  // its receive buffer is free again
        break;
      }
      case Op::backward_weight: {
        const double t0 = now_s();
        stage_.backward_weight(a.mb, &a == last_backward ? grads_done_from : nullptr);
        const double t1 = now_s();
        st.compute_s += t1 - t0;
        trace.span(to_string(a), "backward", t0, t1, a.mb);
        update(a.mb);
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

