#include "pipetrain/pipeline/executor.hpp"

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>

#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/faults.hpp"

namespace pipetrain {
namespace {

// Test hook (util/faults.hpp): a slowed rank's compute that began at t0 (cpu0 on its thread's CPU
// clock) lasts `stretch` times as long on the clock its passes are timed with; it spins, holding
// its core as a throttled one would. Ranks sharing a core are timed in CPU time: a spin measured
// on the wall clock would get only the share of the core its neighbour leaves it, and one measured
// on both would count, as CPU, the time its neighbour held the core during the pass.
void stretch_compute(double t0, double cpu0, double stretch, bool cpu_timed) {
  if (stretch <= 1) return;
  double (*const clock)() = cpu_timed ? thread_cpu_s : now_s;
  const double start = cpu_timed ? cpu0 : t0, until = start + stretch * (clock() - start);
  while (clock() < until) {
  }
}

// Each chunk's last backward, after which its parameter gradients are final; null where the
// data-parallel all-reduce may not start during it (a later chunk, higher in the buffers, is not
// finished before it).
std::vector<const Action*> last_backwards(const ActionList& actions, int chunks) {
  std::vector<const Action*> last(chunks, nullptr);
  for (const Action& a : actions)
    if (a.op == Op::backward || a.op == Op::backward_weight) last[a.chunk] = &a;
  for (int c = 0; c < chunks; ++c)
    for (int later = c + 1; later < chunks && last[c]; ++later)
      if (last[later] > last[c]) last[c] = nullptr;
  return last;
}

}  // namespace

struct Executor::Step {
  Step(const ActionList& list, Trace& tr, const std::function<void(int)>& load,
       const std::function<void(size_t)>& grads_done, const std::function<bool(int)>& params, int micro_batches,
       int chunks)
      : trace(tr),
        load_inputs(load),
        grads_done_from(grads_done),
        params_needed(params),
        M(micro_batches),
        last_backward(last_backwards(list, chunks)),
        has_backward(static_cast<size_t>(micro_batches) * chunks, false),
        held(static_cast<size_t>(micro_batches) * chunks, 0) {
    for (const Action& a : list)
      if (a.op == Op::backward || a.op == Op::backward_input) has_backward[a.chunk * M + a.mb] = true;
  }

  Trace& trace;
  const std::function<void(int)>& load_inputs;
  const std::function<void(size_t)>& grads_done_from;
  const std::function<bool(int)>& params_needed;
  const int M;                                     // micro-batches
  const std::vector<const Action*> last_backward;  // per chunk (last_backwards)
  std::vector<bool> has_backward;                  // per (chunk, mb): evaluation lists have none
  std::vector<size_t> held;                        // activation bytes per (chunk, mb)
  size_t held_total = 0;
  const double stretch = fault_hooks().compute_stretch();
  StepStats stats;
  std::vector<double> own_turn;  // a vee's turn is a message to this rank itself: not a link
  float* act_out = nullptr;      // the buffer the last forward's output is sent from
  float* grad_out = nullptr;     // and the last backward's input gradient
  const float* grad_in = nullptr;
  Action grad_in_for{Op::recv_grad, -1};  // whose gradient grad_in is

  std::function<void(size_t)> done_hook(const Action& a) const {
    return &a == last_backward[a.chunk] ? grads_done_from : std::function<void(size_t)>();
  }
  std::vector<double>& transfers_from(int peer_stage, int own_stage) {
    return peer_stage == own_stage ? own_turn : stats.transfer_s[peer_stage];
  }
};

Executor::Executor(Stage& stage, Comm& comm, const StepShape& shape)
    : stage_(stage),
      comm_(comm),
      tensor_group_(comm),
      expert_group_(comm),
      shape_(shape),
      links_(shape.chunk_placement(), comm.topo().stage, shape.micro_batches, stage.boundary_floats()),
      staging_(stage.boundary_floats()) {
  stage_.set_tensor_group(&tensor_group_);
  stage_.set_expert_group(&expert_group_);
}

StepStats Executor::run(const ActionList& actions, Trace& trace, const std::function<void(int)>& load_inputs,
                        const std::function<void(size_t)>& grads_done_from,
                        const std::function<bool(int)>& params_needed) {
  using Handler = void (Executor::*)(Step&, const Action&);
  static constexpr Handler kHandlers[] = {&Executor::recv_act,  &Executor::forward,        &Executor::send_act,
                                          &Executor::recv_grad, &Executor::backward,       &Executor::send_grad,
                                          &Executor::backward,  &Executor::backward_weight};
  static_assert(std::size(kHandlers) == static_cast<size_t>(Op::backward_weight) + 1, "one handler per Op");
  Step s(actions, trace, load_inputs, grads_done_from, params_needed, shape_.micro_batches, stage_.chunks());
  // Messages keep moving while the stage computes (a paired forward's send while the backward
  // after it runs): one test of each pending request at the stage's poll points.
  stage_.set_poll([this] { links_.progress(comm_); });
  struct Unhook {
    Stage& stage;
    ~Unhook() { stage.set_poll(nullptr); }
  } unhook{stage_};
  const double wait0 = comm_.wait_seconds();
  links_.post_receives(actions, comm_, clock_offset_s_);
  for (const Action& a : actions) (this->*kHandlers[static_cast<size_t>(a.op)])(s, a);
  const double t0 = now_s();
  links_.drain_sends(comm_);
  trace.span("wait sends", "wait", t0, now_s());
  s.stats.wait_s = comm_.wait_seconds() - wait0;
  return std::move(s.stats);
}

template <class Pass>
void Executor::timed_pass(Step& s, const Action& a, const char* category, Pass&& pass) {
  auto cpu_now = [&] { return time_cpu_ ? thread_cpu_s() : 0.0; };
  const double t0 = now_s(), cpu0 = cpu_now(), data_wait0 = comm_.data_wait_seconds();
  const double recompute_s = pass();
  finish_compute();
  stretch_compute(t0, cpu0, s.stretch, time_cpu_);
  const double t1 = now_s();
  s.stats.compute_s += t1 - t0 - (comm_.data_wait_seconds() - data_wait0);  // ZeRO-3's weights: a wait, not work
  s.stats.compute_cpu_s += cpu_now() - cpu0;
  // Recompute shown first; under recompute = block it is really interleaved block by block.
  if (recompute_s > 0) s.trace.span("R" + to_string(a).substr(1), "recompute", t0, t0 + recompute_s, a.mb);
  s.trace.span(to_string(a), category, t0 + recompute_s, t1, a.mb);
  for (const CommTensorGroup::Span& c : tensor_group_.take_spans()) s.trace.span(c.name, "tp_comm", c.t0, c.t1, a.mb);
  for (const CommExpertGroup::Span& c : expert_group_.take_spans())
    s.trace.span(c.name, Trace::kExpertExchange, c.t0, c.t1, a.mb);
  count_held(s, a);
}

void Executor::count_held(Step& s, const Action& a) {
  size_t& mine = s.held[a.chunk * s.M + a.mb];
  const size_t b = stage_.stash_bytes(a.chunk, a.mb);
  s.held_total = s.held_total + b - mine;
  mine = b;
  s.stats.act_peak_bytes = std::max(s.stats.act_peak_bytes, s.held_total);
}

void Executor::recv_act(Step& s, const Action& a) {
  const double t0 = now_s();
  const int from = links_.prev(a);
  RecvRing& ring = links_.act_in(a);
  const float* in =
      ring.wait(comm_, {"recv activation", from, a.mb}, clock_offset_s_, s.transfers_from(from, comm_.topo().stage));
  const double t1 = now_s();
  s.trace.span("wait " + to_string(a), "wait", t0, t1, a.mb);
  upload(stage_.input_buffer(a.chunk, a.mb), in, ring.floats * sizeof(float));  // stashed until its backward
  s.stats.compute_s += now_s() - t1;
  ring.post(comm_, clock_offset_s_);
  count_held(s, a);
}

void Executor::forward(Step& s, const Action& a) {
  if (const double t0 = now_s(); s.params_needed && s.params_needed(a.chunk))
    s.trace.span("wait parameter all-gather", "wait", t0, now_s(), a.mb);
  const bool first = stage_.first(a.chunk), last = stage_.last(a.chunk);
  s.act_out =
      last ? nullptr : links_.act_out(a).acquire(comm_, links_.act_out_tag(a), a.mb, "send activation", s.trace);
  timed_pass(s, a, "forward", [&] {
    if (first || last || stage_.masks_documents()) {  // every chunk needs the documents' starts
      s.load_inputs(a.mb);
      count_held(s, a);
    }
    s.stats.loss_sum += stage_.forward(a.chunk, a.mb, staging_.output(s.act_out));
    staging_.output_done(s.act_out);
    return 0.0;
  });
  if (!s.has_backward[a.chunk * s.M + a.mb]) {
    stage_.discard(a.chunk, a.mb);
    count_held(s, a);
  }
}

// What leaves this rank for another: a vee's turn, a message to this rank itself, travels no link.
void Executor::count_sent(StepStats& stats, const SendRing& ring) const {
  if (ring.peer != comm_.topo().stage) stats.p2p_bytes += ring.floats * sizeof(float);
}

void Executor::send_act(Step& s, const Action& a) {
  SendRing& ring = links_.act_out(a);
  ring.send(comm_, links_.act_out_tag(a), a, clock_offset_s_);
  count_sent(s.stats, ring);
}

void Executor::recv_grad(Step& s, const Action& a) {
  const double t0 = now_s();
  const int from = links_.next(a);
  s.grad_in = links_.grad_in(a).wait(comm_, {"recv gradient", from, a.mb}, clock_offset_s_,
                                     s.transfers_from(from, comm_.topo().stage));
  s.trace.span("wait " + to_string(a), "wait", t0, now_s(), a.mb);
  s.grad_in_for = a;
}

void Executor::backward(Step& s, const Action& a) {
  const bool first = stage_.first(a.chunk), last = stage_.last(a.chunk);
  s.grad_out =
      first ? nullptr : links_.grad_out(a).acquire(comm_, links_.grad_out_tag(a), a.mb, "send gradient", s.trace);
  if (!last && (s.grad_in_for.mb != a.mb || s.grad_in_for.chunk != a.chunk))
    throw std::logic_error("schedule runs backward " + to_string(a) + " without receiving its gradient first");
  timed_pass(s, a, "backward", [&] {
    const float* dout = staging_.grad_in(last ? nullptr : s.grad_in);
    float* dinp = staging_.grad_out(s.grad_out);
    if (a.op == Op::backward) {
      stage_.backward(a.chunk, a.mb, dout, dinp, s.done_hook(a));
    } else {
      stage_.backward_input(a.chunk, a.mb, dout, dinp);
    }
    staging_.grad_out_done(s.grad_out);
    return stage_.last_recompute_s();
  });
  if (!last) links_.grad_in(a).post(comm_, clock_offset_s_);  // its receive buffer is free again
}

void Executor::backward_weight(Step& s, const Action& a) {
  timed_pass(s, a, "backward", [&] {
    stage_.backward_weight(a.chunk, a.mb, s.done_hook(a));
    return 0.0;
  });
}

void Executor::send_grad(Step& s, const Action& a) {
  SendRing& ring = links_.grad_out(a);
  ring.send(comm_, links_.grad_out_tag(a), a, clock_offset_s_);
  count_sent(s.stats, ring);
}

}  // namespace pipetrain
