#include "pipetrain/schedule/simulate.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

namespace pipetrain {

double SimResult::mean_bubble() const {
  double sum = 0;
  for (double b : bubble) sum += b;
  return bubble.empty() ? 0 : sum / bubble.size();
}

SimResult simulate(const std::vector<ActionList>& lists, const std::vector<double>& fwd, const std::vector<double>& bwd,
                   const std::vector<double>& wgt) {
  const int P = static_cast<int>(lists.size()), n_virtual = static_cast<int>(fwd.size());
  SimResult r;
  r.busy.assign(P, 0);
  r.spans.resize(P);
  std::vector<size_t> next(P, 0);
  std::vector<double> clock(P, 0);
  // When the activation from virtual stage v to v+1 (the gradient from v+1 to v) of a micro-batch
  // was sent, keyed by (v, mb).
  std::map<std::pair<int, int>, double> act_sent, grad_sent;
  // Per rank: messages it has produced towards its next / previous rank, and when it took each
  // message from its previous / next rank (a receive frees a ring slot in the executor).
  std::vector<int> acts_made(P, 0), grads_made(P, 0);
  std::vector<std::vector<double>> acts_taken(P), grads_taken(P);
  // A compute whose result goes to rank `to` waits until `to` has taken enough earlier messages.
  auto room = [&](int made, const std::vector<double>& taken, double& at) {
    const int need = made - kMessageRing - 1;  // messages the receiver must have taken
    if (need <= 0) return true;
    if (static_cast<int>(taken.size()) < need) return false;
    at = std::max(at, taken[need - 1]);
    return true;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      for (; next[s] < lists[s].size(); ++next[s], progress = true) {
        const Action& a = lists[s][next[s]];
        const int v = a.chunk * P + s;
        if (v >= n_virtual) throw std::logic_error("no costs for virtual stage " + std::to_string(v));
        if (a.op == Op::recv_act || a.op == Op::recv_grad) {
          const auto& sent = a.op == Op::recv_act ? act_sent : grad_sent;
          auto it = sent.find({a.op == Op::recv_act ? v - 1 : v, a.mb});
          if (it == sent.end()) break;  // blocked until the peer sends
          clock[s] = std::max(clock[s], it->second);
          if (a.op == Op::recv_act) acts_taken[s].push_back(clock[s]);
        } else if (a.op == Op::send_act) {
          act_sent[{v, a.mb}] = clock[s];
        } else if (a.op == Op::send_grad) {
          grad_sent[{v - 1, a.mb}] = clock[s];
        } else {
          double start = clock[s];
          const bool makes_act = a.op == Op::forward && v + 1 < n_virtual;
          const bool makes_grad = (a.op == Op::backward || a.op == Op::backward_input) && v > 0;
          if (makes_act && !room(acts_made[s], acts_taken[(s + 1) % P], start)) break;
          if (makes_grad && !room(grads_made[s], grads_taken[(s + P - 1) % P], start)) break;
          acts_made[s] += makes_act, grads_made[s] += makes_grad;
          // the gradient received for this backward: its buffer is free once the backward has run
          const bool took_grad = (a.op == Op::backward || a.op == Op::backward_input) && v + 1 < n_virtual;
          const double w = wgt.empty() ? bwd[v] / 2 : wgt[v];
          const double cost = a.op == Op::forward            ? fwd[v]
                              : a.op == Op::backward_weight ? w
                              : a.op == Op::backward_input  ? bwd[v] - w
                                                            : bwd[v];
          r.spans[s].push_back({start, start + cost, a});
          clock[s] = start + cost;
          r.busy[s] += cost;
          if (took_grad) grads_taken[s].push_back(clock[s]);
        }
      }
    }
  }
  for (int s = 0; s < P; ++s) {
    if (next[s] < lists[s].size())
      throw std::logic_error("schedule deadlocks: stage " + std::to_string(s) + " waits forever at " +
                             to_string(lists[s][next[s]]));
    r.makespan = std::max(r.makespan, clock[s]);
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
      for (long t = std::lround(sp.start); t < std::lround(sp.end) && t < slots; ++t)
        cells[s][t] = to_string(sp.action), width = std::max(width, cells[s][t].size() + 1);
  const std::string last_label = "Stage " + std::to_string(P - 1) + ":";
  const size_t label_width = std::max<size_t>(10, last_label.size() + 2);
  auto pad = [](std::string s, size_t width, size_t display) { return s + std::string(width > display ? width - display : 1, ' '); };
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
