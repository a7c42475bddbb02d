#include "pipetrain/schedule/simulate.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <tuple>

namespace pipetrain {

double SimResult::mean_bubble() const {
  double sum = 0;
  for (double b : bubble) sum += b;
  return bubble.empty() ? 0 : sum / bubble.size();
}

namespace {

// A message between virtual stages: an activation from `from` to from+1 or a gradient from `from`
// to from-1, of one micro-batch.
struct MessageKey {
  bool grad;
  int from, mb;
  bool operator<(const MessageKey& o) const { return std::tie(grad, from, mb) < std::tie(o.grad, o.from, o.mb); }
};

struct Message {
  double issued = -1;   // when its sender sent it (-1: not yet)
  double transfer = 0;  // how long it travels
  int receiver = -1;    // the rank taking it, and its place in that rank's receives from its link
  size_t index = 0;
};

// A link's ring: messages of one kind (0: activations, 1: gradients) with one peer.
using Link = std::pair<int, int>;  // (kind, peer)

// One rank's progress through its list, with its rings per link.
struct RankState {
  size_t next = 0;
  double clock = 0;
  std::map<Link, std::vector<double>> freed;     // when each receive's buffer was handed back
  std::map<Link, std::vector<MessageKey>> made;  // the messages its computes produced, in order
};

}  // namespace

SimResult simulate(const std::vector<ActionList>& lists, const std::vector<double>& fwd, const std::vector<double>& bwd,
                   const std::vector<double>& wgt, Placement placement, double message_s) {
  const int P = static_cast<int>(lists.size()), n_virtual = static_cast<int>(fwd.size());
  const ChunkPlacement place{P, std::max(1, n_virtual / std::max(1, P)), placement};
  SimResult r;
  r.busy.assign(P, 0);
  r.spans.resize(P);
  std::vector<RankState> rank(P);
  std::map<MessageKey, Message> messages;
  auto key_of_receive = [&](const Action& a, int v) {
    return a.op == Op::recv_act ? MessageKey{false, v - 1, a.mb} : MessageKey{true, v + 1, a.mb};
  };
  // The rank a compute's result goes to (a forward's activation up, a backward's gradient down),
  // and the rank a receive's message comes from.
  auto to_peer = [&](const Action& a, int v) { return place.stage_of(a.op == Op::forward ? v + 1 : v - 1); };
  auto from_peer = [&](const Action& a, int v) {  // a receive's sender
    return place.stage_of(a.op == Op::recv_act ? v - 1 : v + 1);
  };
  for (int s = 0; s < P; ++s) {
    std::map<Link, size_t> taken;
    for (const Action& a : lists[s])
      if (a.op == Op::recv_act || a.op == Op::recv_grad) {
        const int v = place.vstage(s, a.chunk);
        Message& m = messages[key_of_receive(a, v)];
        m.receiver = s;
        m.index = taken[{a.op == Op::recv_grad, from_peer(a, v)}]++;
      }
  }
  // When the receive of message m from `sender` was posted: at the start for the first
  // kMessageRing of its link, else when the buffer kMessageRing receives earlier was handed back
  // (-1: not yet known).
  auto posted = [&](const Message& m, bool grad, int sender) -> double {
    if (m.receiver < 0) return -1;  // nobody receives it: its send can never complete
    if (m.index < static_cast<size_t>(kMessageRing)) return 0;
    const std::vector<double>& freed = rank[m.receiver].freed[{grad, sender}];
    return m.index - kMessageRing < freed.size() ? freed[m.index - kMessageRing] : -1;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      RankState& me = rank[s];
      for (; me.next < lists[s].size(); ++me.next, progress = true) {
        const Action& a = lists[s][me.next];
        const int v = place.vstage(s, a.chunk);
        if (v >= n_virtual) throw std::logic_error("no costs for virtual stage " + std::to_string(v));
        if (a.op == Op::recv_act || a.op == Op::recv_grad) {
          const Message& m = messages.at(key_of_receive(a, v));
          if (m.issued < 0) break;  // blocked until the peer sends
          me.clock = std::max(me.clock, m.issued + m.transfer);
          if (a.op == Op::recv_act)
            me.freed[{0, from_peer(a, v)}].push_back(me.clock);  // copied into the stage at once
        } else if (a.op == Op::send_act || a.op == Op::send_grad) {
          Message& m = messages[{a.op == Op::send_grad, v, a.mb}];
          m.issued = me.clock;
          m.transfer = m.receiver == s ? 0 : message_s;
        } else {
          double start = me.clock;
          const bool makes_act = a.op == Op::forward && v + 1 < n_virtual;
          const bool makes_grad = (a.op == Op::backward || a.op == Op::backward_input) && v > 0;
          if (makes_act || makes_grad) {  // the link's send buffer must be free again
            std::vector<MessageKey>& made = me.made[{makes_grad, to_peer(a, v)}];
            if (made.size() >= static_cast<size_t>(kMessageRing)) {
              const Message& earlier = messages[made[made.size() - kMessageRing]];
              const double at = posted(earlier, makes_grad, s);
              if (earlier.issued < 0 || at < 0) break;
              start = std::max(start, std::max(earlier.issued, at) + earlier.transfer);
            }
            made.push_back({makes_grad, v, a.mb});
          }
          const double w = wgt.empty() ? bwd[v] / 2 : wgt[v];
          const double cost = a.op == Op::forward           ? fwd[v]
                              : a.op == Op::backward_weight ? w
                              : a.op == Op::backward_input  ? bwd[v] - w
                                                            : bwd[v];
          r.spans[s].push_back({start, start + cost, a});
          me.clock = start + cost;
          r.busy[s] += cost;
          // the gradient received for this backward: its buffer is free once the backward has run
          if ((a.op == Op::backward || a.op == Op::backward_input) && v + 1 < n_virtual)
            me.freed[{1, place.stage_of(v + 1)}].push_back(me.clock);
        }
      }
    }
  }
  for (int s = 0; s < P; ++s) {
    if (rank[s].next < lists[s].size())
      throw std::logic_error("schedule deadlocks: stage " + std::to_string(s) + " waits forever at " +
                             to_string(lists[s][rank[s].next]));
    r.makespan = std::max(r.makespan, rank[s].clock);
  }
  for (int s = 0; s < P; ++s) r.bubble.push_back(r.makespan > 0 ? 1 - r.busy[s] / r.makespan : 0);
  return r;
}

std::string render_chart(const SimResult& sim, int max_slots) {
  const int slots = static_cast<int>(std::lround(sim.makespan));
  if (slots > max_slots) return "";
  const int P = static_cast<int>(sim.spans.size());
  const std::string dot = "\u00b7";  // '·', one column wide, two bytes
  std::vector<std::vector<std::string>> cells(P, std::vector<std::string>(slots, dot));
  size_t width = 4;  // the classic chart's columns; wider for chunk labels such as "B12.1"
  for (int s = 0; s < P; ++s)
    for (const SimSpan& sp : sim.spans[s])
      for (long t = std::lround(sp.start); t < std::lround(sp.end) && t < slots; ++t) {
        cells[s][t] = to_string(sp.action);
        width = std::max(width, cells[s][t].size() + 1);
      }
  const std::string last_label = "Stage " + std::to_string(P - 1) + ":";
  const size_t label_width = std::max<size_t>(10, last_label.size() + 2);
  auto pad = [](std::string s, size_t width, size_t display) {
    return s + std::string(width > display ? width - display : 1, ' ');
  };
  auto trim = [](std::string s) { return s.erase(s.find_last_not_of(' ') + 1); };
  std::string out = pad("t:", label_width, 2);
  for (int t = 0; t < slots; ++t) out += pad(std::to_string(t), width, std::to_string(t).size());
  out = trim(out) + "\n";
  for (int s = 0; s < P; ++s) {
    const std::string label = "Stage " + std::to_string(s) + ":";
    std::string row = pad(label, label_width, label.size());
    for (auto& c : cells[s]) row += pad(c, width, c == dot ? 1 : c.size());
    out += trim(row) + "\n";
  }
  return out;
}

}  // namespace pipetrain
