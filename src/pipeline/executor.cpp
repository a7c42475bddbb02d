#include "pipetrain/pipeline/executor.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/faults.hpp"

namespace pipetrain {
namespace {

// Messages over the boundary between virtual stages v and v+1 carry tags 2(vM + mb) (activation)
// and 2(vM + mb) + 1 (gradient): unique within a step whatever order the schedule sends them in.
int act_tag(int boundary, int mb, int M) { return 2 * (boundary * M + mb); }
int grad_tag(int boundary, int mb, int M) { return 2 * (boundary * M + mb) + 1; }

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

// A message's send time sits in the two floats after its data.
void write_stamp(float* after_data, double t) { std::memcpy(after_data, &t, sizeof t); }
double read_stamp(const float* after_data) {
  double t;
  std::memcpy(&t, after_data, sizeof t);
  return t;
}

}  // namespace

int64_t Executor::max_tag(const StepShape& shape) {
  // grad_tag(n_virtual - 2, M - 1, M), in 64 bits
  return 2 * (int64_t{shape.virtual_stages() - 1} * shape.micro_batches) - 1;
}

Executor::Executor(Stage& stage, Comm& comm, const StepShape& shape) : stage_(stage), comm_(comm), shape_(shape) {
  const size_t n = stage.boundary_floats();
  for (const MessageLink& link : message_links(shape.chunk_placement(), comm.topo().stage)) {
    if (link.in) {
      in_[link].open(link.peer, n);
    } else {
      SendRing& r = out_[link];
      r.open(link.peer, n);
      r.mb.assign(kRing, -1);
      r.tag.assign(kRing, -1);
    }
  }
  if (compute_device() == Device::gpu)
    for (Floats* f : {&dev_out_, &dev_grad_in_, &dev_grad_out_}) f->resize(n);
}

void Executor::RecvRing::post(Comm& comm, double clock_offset_s) {
  posted_at.resize(kRing);
  for (; posted < order.size() && posted < used + kRing; ++posted) {
    const size_t slot = posted % kRing;
    reqs[slot] = comm.irecv(bufs[slot].data(), bufs[slot].size(), peer, order[posted]);
    posted_at[slot] = now_s() + clock_offset_s;
  }
}

float* Executor::RecvRing::wait(Comm& comm, const WaitLabel& label, double clock_offset_s, std::vector<double>& transfer_s) {
  const size_t slot = used++ % kRing;
  const bool waited = comm.wait(reqs[slot], label);
  float* message = bufs[slot].data();
  if (waited) {  // it arrived just now: it travelled from when it was sent or its receive posted, whichever came later
    const double sent = read_stamp(message + bufs[slot].size() - kStampFloats);
    transfer_s.push_back(now_s() + clock_offset_s - std::max(sent, posted_at[slot]));
  }
  return message;
}

float* Executor::SendRing::acquire(Comm& comm, int for_tag, int for_mb, const char* what, Trace& trace) {
  const size_t slot = next++ % kRing;
  const double t0 = now_s();
  comm.wait(reqs[slot], {what, peer, mb[slot]});  // the earlier send from this buffer
  if (mb[slot] >= 0) trace.span(std::string("wait ") + what + " " + std::to_string(mb[slot]), "wait", t0, now_s(), mb[slot]);
  tag[slot] = for_tag, mb[slot] = for_mb;
  return bufs[slot].data();
}

size_t Executor::SendRing::slot_of(int for_tag, const Action& a) const {
  for (size_t s = 0; s < kRing; ++s)
    if (tag[s] == for_tag) return s;
  throw std::logic_error("schedule sends " + to_string(a) + " before computing it");
}

void Executor::SendRing::drain(Comm& comm, const char* what) {
  for (size_t s = 0; s < kRing; ++s) comm.wait(reqs[s], {what, peer, mb[s]}), tag[s] = mb[s] = -1;  // none stale next step
}

void Executor::progress() {
  for (auto& [link, ring] : in_) comm_.progress(ring.reqs);
  for (auto& [link, ring] : out_) comm_.progress(ring.reqs);
}

StepStats Executor::run(const ActionList& actions, Trace& trace, const std::function<void(int)>& load_inputs,
                        const std::function<void(size_t)>& grads_done_from,
                        const std::function<bool(int)>& params_needed) {
  const int M = shape_.micro_batches, stage = comm_.topo().stage, chunks = stage_.chunks();
  const ChunkPlacement placement = shape_.chunk_placement();
  auto vstage = [&](const Action& a) { return placement.vstage(stage, a.chunk); };
  // The ranks holding the virtual stages before and after this action's chunk, and the rings of
  // the links to them.
  auto prev = [&](const Action& a) { return placement.stage_of(vstage(a) - 1); };
  auto next = [&](const Action& a) { return placement.stage_of(vstage(a) + 1); };
  auto act_in = [&](const Action& a) -> RecvRing& { return in_.at({false, true, prev(a)}); };
  auto grad_in_ring = [&](const Action& a) -> RecvRing& { return in_.at({true, true, next(a)}); };
  auto act_out_ring = [&](const Action& a) -> SendRing& { return out_.at({false, false, next(a)}); };
  auto grad_out_ring = [&](const Action& a) -> SendRing& { return out_.at({true, false, prev(a)}); };
  // Each chunk's last backward, after which its parameter gradients are final. The data-parallel
  // all-reduce may start during it if every later chunk (higher in the buffers) finished before.
  std::vector<const Action*> last_backward(chunks, nullptr);
  for (const Action& a : actions)
    if (a.op == Op::backward || a.op == Op::backward_weight) last_backward[a.chunk] = &a;
  for (int c = 0; c < chunks; ++c)
    for (int later = c + 1; later < chunks && last_backward[c]; ++later)
      if (last_backward[later] > last_backward[c]) last_backward[c] = nullptr;
  auto done_hook = [&](const Action& a) {
    return &a == last_backward[a.chunk] ? grads_done_from : std::function<void(size_t)>();
  };
  std::vector<bool> has_backward(static_cast<size_t>(M) * chunks, false);
  for (const Action& a : actions)
    if (a.op == Op::backward || a.op == Op::backward_input) has_backward[a.chunk * M + a.mb] = true;

  StepStats st;
  const size_t n = stage_.boundary_floats(), bytes = n * sizeof(float);
  const double stretch = fault_hooks().compute_stretch();
  auto cpu_now = [&] { return time_cpu_ ? thread_cpu_s() : 0.0; };
  std::vector<double> own_turn;  // a vee's turn is a message to this rank itself: not a link
  auto transfers_from = [&](int peer_stage) -> std::vector<double>& {
    return peer_stage == stage ? own_turn : st.transfer_s[peer_stage];
  };
  auto send = [&](SendRing& ring, size_t slot, int tag) {
    write_stamp(ring.bufs[slot].data() + n, now_s() + clock_offset_s_);
    ring.reqs[slot] = comm_.isend(ring.bufs[slot].data(), n + kStampFloats, ring.peer, tag);
  };
  // Messages keep moving while the stage computes (a paired forward's send while the backward
  // after it runs): one test of each pending request at the stage's poll points.
  stage_.set_poll([this] { progress(); });
  struct Unhook {
    Stage& stage;
    ~Unhook() { stage.set_poll(nullptr); }
  } unhook{stage_};
  const double wait0 = comm_.wait_seconds();
  const bool staged = compute_device() == Device::gpu;

  // Activation bytes held, counted from the stage's buffers after every change.
  std::vector<size_t> held(static_cast<size_t>(M) * chunks, 0);
  size_t total = 0;
  auto update = [&](const Action& a) {
    size_t& mine = held[a.chunk * M + a.mb];
    const size_t b = stage_.stash_bytes(a.chunk, a.mb);
    total = total + b - mine;
    mine = b;
    st.act_peak_bytes = std::max(st.act_peak_bytes, total);
  };

  for (auto& [link, ring] : in_) ring.order.clear(), ring.posted = ring.used = 0;
  for (const Action& a : actions) {
    if (a.op == Op::recv_act) act_in(a).order.push_back(act_tag(vstage(a) - 1, a.mb, M));
    if (a.op == Op::recv_grad) grad_in_ring(a).order.push_back(grad_tag(vstage(a), a.mb, M));
  }
  for (auto& [link, ring] : in_) ring.post(comm_, clock_offset_s_);

  float* act_out = nullptr;
  float* grad_out = nullptr;
  const float* grad_in = nullptr;
  Action grad_in_for{Op::recv_grad, -1};
  for (const Action& a : actions) {
    const int v = vstage(a);
    const bool first = stage_.first(a.chunk), last = stage_.last(a.chunk);
    switch (a.op) {
      case Op::recv_act: {
        const double t0 = now_s();
        const float* in = act_in(a).wait(comm_, {"recv activation", prev(a), a.mb}, clock_offset_s_, transfers_from(prev(a)));
        const double t1 = now_s();
        trace.span("wait " + to_string(a), "wait", t0, t1, a.mb);
        upload(stage_.input_buffer(a.chunk, a.mb), in, n * sizeof(float));  // stashed until its backward
        st.compute_s += now_s() - t1;
        act_in(a).post(comm_, clock_offset_s_);
        update(a);
        break;
      }
      case Op::forward: {
        if (const double t0 = now_s(); params_needed && params_needed(a.chunk))
          trace.span("wait parameter all-gather", "wait", t0, now_s(), a.mb);
        act_out = last ? nullptr : act_out_ring(a).acquire(comm_, act_tag(v, a.mb, M), a.mb, "send activation", trace);
        const double t0 = now_s(), cpu0 = cpu_now();
        if (first || last) load_inputs(a.mb), update(a);
        st.loss_sum += stage_.forward(a.chunk, a.mb, staged && !last ? dev_out_.data() : act_out);
        if (staged && !last) download(act_out, dev_out_.data(), bytes);
        finish_compute();
        stretch_compute(t0, cpu0, stretch, time_cpu_);
        const double t1 = now_s();
        st.compute_s += t1 - t0, st.compute_cpu_s += cpu_now() - cpu0;
        trace.span(to_string(a), "forward", t0, t1, a.mb);
        update(a);
        if (!has_backward[a.chunk * M + a.mb]) stage_.discard(a.chunk, a.mb), update(a);
        break;
      }
      case Op::send_act: {
        const int tag = act_tag(v, a.mb, M);
        SendRing& ring = act_out_ring(a);
        send(ring, ring.slot_of(tag, a), tag);
        break;
      }
      case Op::recv_grad: {
        const double t0 = now_s();
        grad_in = grad_in_ring(a).wait(comm_, {"recv gradient", next(a), a.mb}, clock_offset_s_, transfers_from(next(a)));
        trace.span("wait " + to_string(a), "wait", t0, now_s(), a.mb);
        grad_in_for = a;
        break;
      }
      case Op::backward:
      case Op::backward_input: {
        grad_out = first ? nullptr : grad_out_ring(a).acquire(comm_, grad_tag(v - 1, a.mb, M), a.mb, "send gradient", trace);
        if (!last && (grad_in_for.mb != a.mb || grad_in_for.chunk != a.chunk))
          throw std::logic_error("schedule runs backward " + to_string(a) + " without receiving its gradient first");
        const double t0 = now_s(), cpu0 = cpu_now();
        const float* dout = grad_in;
        float* dinp = grad_out;
        if (staged) {
          if (!last) upload(dev_grad_in_.data(), grad_in, bytes), dout = dev_grad_in_.data();
          if (!first) dinp = dev_grad_out_.data();
        }
        if (a.op == Op::backward) stage_.backward(a.chunk, a.mb, dout, dinp, done_hook(a));
        else stage_.backward_input(a.chunk, a.mb, dout, dinp);
        if (staged && !first) download(grad_out, dinp, bytes);
        finish_compute();
        stretch_compute(t0, cpu0, stretch, time_cpu_);
        const double t1 = now_s(), rs = stage_.last_recompute_s();
        st.compute_s += t1 - t0, st.compute_cpu_s += cpu_now() - cpu0;
        // Recompute shown first; under recompute = block it is really interleaved block by block.
        if (rs > 0) trace.span("R" + to_string(a).substr(1), "recompute", t0, t0 + rs, a.mb);
        trace.span(to_string(a), "backward", t0 + rs, t1, a.mb);
        update(a);
        if (!last) grad_in_ring(a).post(comm_, clock_offset_s_);  // its receive buffer is free again
        break;
      }
      case Op::backward_weight: {
        const double t0 = now_s(), cpu0 = cpu_now();
        stage_.backward_weight(a.chunk, a.mb, done_hook(a));
        finish_compute();
        stretch_compute(t0, cpu0, stretch, time_cpu_);
        const double t1 = now_s();
        st.compute_s += t1 - t0, st.compute_cpu_s += cpu_now() - cpu0;
        trace.span(to_string(a), "backward", t0, t1, a.mb);
        update(a);
        break;
      }
      case Op::send_grad: {
        const int tag = grad_tag(v - 1, a.mb, M);
        SendRing& ring = grad_out_ring(a);
        send(ring, ring.slot_of(tag, a), tag);
        break;
      }
    }
  }
  const double t0 = now_s();
  for (auto& [link, ring] : out_) ring.drain(comm_, link.grad ? "send gradient" : "send activation");
  trace.span("wait sends", "wait", t0, now_s());
  st.wait_s = comm_.wait_seconds() - wait0;
  return st;
}

}  // namespace pipetrain
