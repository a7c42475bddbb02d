#include "pipetrain/pipeline/message_rings.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "pipetrain/util/clock.hpp"

namespace pipetrain {
namespace {

void write_stamp(float* after_data, double t) { std::memcpy(after_data, &t, sizeof t); }
double read_stamp(const float* after_data) {
  double t;
  std::memcpy(&t, after_data, sizeof t);
  return t;
}

}  // namespace

void Ring::open(int with, size_t data_floats) {
  peer = with;
  floats = data_floats;
  bufs.assign(kMessageRing, std::vector<float>(floats + kStampFloats));
  reqs.assign(kMessageRing, Request());
}

void RecvRing::post(Comm& comm, double clock_offset_s) {
  posted_at.resize(kMessageRing);
  for (; posted < order.size() && posted < used + kMessageRing; ++posted) {
    const size_t slot = posted % kMessageRing;
    reqs[slot] = comm.irecv(bufs[slot].data(), bufs[slot].size(), peer, order[posted]);
    posted_at[slot] = now_s() + clock_offset_s;
  }
}

float* RecvRing::wait(Comm& comm, const WaitLabel& label, double clock_offset_s, std::vector<double>& transfer_s) {
  const size_t slot = used++ % kMessageRing;
  const bool waited = comm.wait(reqs[slot], label);
  float* message = bufs[slot].data();
  if (waited) {  // it arrived just now: it travelled from when it was sent or its receive posted, whichever came later
    const double sent = read_stamp(message + floats);
    transfer_s.push_back(now_s() + clock_offset_s - std::max(sent, posted_at[slot]));
  }
  return message;
}

void SendRing::open(int with, size_t data_floats) {
  Ring::open(with, data_floats);
  tag.assign(kMessageRing, -1);
  mb.assign(kMessageRing, -1);
}

float* SendRing::acquire(Comm& comm, int for_tag, int for_mb, const char* what, Trace& trace) {
  const size_t slot = next++ % kMessageRing;
  const double t0 = now_s();
  comm.wait(reqs[slot], {what, peer, mb[slot]});  // the earlier send from this buffer
  if (mb[slot] >= 0) {
    trace.span(std::string("wait ") + what + " " + std::to_string(mb[slot]), "wait", t0, now_s(), mb[slot]);
  }
  tag[slot] = for_tag;
  mb[slot] = for_mb;
  return bufs[slot].data();
}

void SendRing::send(Comm& comm, int for_tag, const Action& a, double clock_offset_s) {
  const auto held = std::find(tag.begin(), tag.end(), for_tag);
  if (held == tag.end()) throw std::logic_error("schedule sends " + to_string(a) + " before computing it");
  std::vector<float>& buf = bufs[held - tag.begin()];
  write_stamp(buf.data() + floats, now_s() + clock_offset_s);
  reqs[held - tag.begin()] = comm.isend(buf.data(), buf.size(), peer, for_tag);
}

void SendRing::drain(Comm& comm, const char* what) {
  for (size_t s = 0; s < kMessageRing; ++s) {
    comm.wait(reqs[s], {what, peer, mb[s]});
    tag[s] = mb[s] = -1;  // none stale next step
  }
}

MessageLinks::MessageLinks(const ChunkPlacement& placement, int stage, int micro_batches, size_t floats)
    : placement_(placement), stage_(stage), micro_batches_(micro_batches) {
  for (const MessageLink& link : message_links(placement, stage)) {
    if (link.in) {
      in_[link].open(link.peer, floats);
    } else {
      out_[link].open(link.peer, floats);
    }
  }
}

void MessageLinks::post_receives(const ActionList& actions, Comm& comm, double clock_offset_s) {
  for (auto& [link, ring] : in_) {
    ring.order.clear();
    ring.posted = ring.used = 0;
  }
  for (const Action& a : actions) {
    if (a.op == Op::recv_act) act_in(a).order.push_back(act_in_tag(a));
    if (a.op == Op::recv_grad) grad_in(a).order.push_back(grad_in_tag(a));
  }
  for (auto& [link, ring] : in_) ring.post(comm, clock_offset_s);
}

void MessageLinks::progress(Comm& comm) {
  for (auto& [link, ring] : in_) comm.progress(ring.reqs);
  for (auto& [link, ring] : out_) comm.progress(ring.reqs);
}

void MessageLinks::drain_sends(Comm& comm) {
  for (auto& [link, ring] : out_) ring.drain(comm, link.grad ? "send gradient" : "send activation");
}

}  // namespace pipetrain
