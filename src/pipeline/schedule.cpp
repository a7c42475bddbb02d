#include "pipetrain/pipeline/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

namespace pipetrain {

ActionList gpipe_schedule(int stage, int n_stages, int micro_batches) {
  const bool first = stage == 0, last = stage == n_stages - 1;
  ActionList list;
  for (int i = 0; i < micro_batches; ++i) {
    if (!first) list.push_back({Op::recv_act, i});
    list.push_back({Op::forward, i});
    if (!last) list.push_back({Op::send_act, i});
  }
  for (int i = micro_batches - 1; i >= 0; --i) {
    if (!last) list.push_back({Op::recv_grad, i});
    list.push_back({Op::backward, i});
    if (!first) list.push_back({Op::send_grad, i});
  }
  return list;
}

ActionList one_f_one_b_schedule(int stage, int n_stages, int micro_batches) {
  const bool first = stage == 0, last = stage == n_stages - 1;
  ActionList list;
  auto forward = [&](int i) {
    if (!first) list.push_back({Op::recv_act, i});
    list.push_back({Op::forward, i});
    if (!last) list.push_back({Op::send_act, i});
  };
  auto backward = [&](int i) {
    if (!last) list.push_back({Op::recv_grad, i});
    list.push_back({Op::backward, i});
    if (!first) list.push_back({Op::send_grad, i});
  };
  // Stage s must run P-1-s forwards before the first gradient can come back to it.
  const int warmup = std::min(n_stages - 1 - stage, micro_batches);
  for (int i = 0; i < warmup; ++i) forward(i);
  for (int i = 0; i + warmup < micro_batches; ++i) forward(i + warmup), backward(i);
  for (int i = std::max(0, micro_batches - warmup); i < micro_batches; ++i) backward(i);
  return list;
}

ActionList zb_h1_schedule(int stage, int n_stages, int micro_batches) {
  const int P = n_stages, M = micro_batches;
  // Unit-time list scheduling of all stages together: done_f[s][mb] / done_b[s][mb] is when that
  // action finished (-1: not yet), so readiness follows the pipeline's data dependencies.
  std::vector<std::vector<int>> done_f(P, std::vector<int>(M, -1)), done_b(P, std::vector<int>(M, -1));
  std::vector<int> next_f(P, 0), next_b(P, 0), next_w(P, 0), held(P, 0);
  std::vector<std::vector<Action>> order(P);
  int finished = 0;
  for (int t = 0; finished < P * 3 * M; ++t) {
    for (int s = 0; s < P; ++s) {
      const int b = next_b[s], f = next_f[s];
      const bool b_ready = b < M && done_f[s][b] >= 0 && done_f[s][b] <= t &&
                           (s == P - 1 || (done_b[s + 1][b] >= 0 && done_b[s + 1][b] <= t));
      const bool f_ready = f < M && held[s] < P - s && (s == 0 || (done_f[s - 1][f] >= 0 && done_f[s - 1][f] <= t));
      if (b_ready) {
        done_b[s][b] = t + 1, order[s].push_back({Op::backward_input, b}), ++next_b[s];
      } else if (f_ready) {
        done_f[s][f] = t + 1, order[s].push_back({Op::forward, f}), ++next_f[s], ++held[s];
      } else if (next_w[s] < next_b[s]) {
        order[s].push_back({Op::backward_weight, next_w[s]++}), --held[s];
      } else {
        continue;  // idle this slot
      }
      ++finished;
    }
  }
  const bool first = stage == 0, last = stage == P - 1;
  ActionList list;
  for (const Action& a : order[stage]) {
    if (a.op == Op::forward && !first) list.push_back({Op::recv_act, a.mb});
    if (a.op == Op::backward_input && !last) list.push_back({Op::recv_grad, a.mb});
    list.push_back(a);
    if (a.op == Op::forward && !last) list.push_back({Op::send_act, a.mb});
    if (a.op == Op::backward_input && !first) list.push_back({Op::send_grad, a.mb});
  }
  return list;
}

ActionList interleaved_schedule(int stage, int n_stages, int micro_batches, int chunks) {
  const int P = n_stages, M = micro_batches, V = chunks, total = M * V, last_v = P * V - 1;
  if (M % P != 0) throw std::invalid_argument("the interleaved schedule needs micro_batches a multiple of pp");
  // This rank's k-th chunk-forward (chunk-backward): groups of P micro-batches go through chunk 0,
  // then chunk 1, ...; backwards take the chunks in reverse, so gradients flow back the same way.
  auto unit = [&](int k, Op op) {
    const int in_group = k % (P * V), chunk = in_group / P;
    return Action{op, k / (P * V) * P + in_group % P, op == Op::forward ? chunk : V - 1 - chunk};
  };
  ActionList list;
  auto forward = [&](int k) {
    const Action a = unit(k, Op::forward);
    const int v = a.chunk * P + stage;
    if (v > 0) list.push_back({Op::recv_act, a.mb, a.chunk});
    list.push_back(a);
    if (v < last_v) list.push_back({Op::send_act, a.mb, a.chunk});
  };
  auto backward = [&](int k) {
    const Action a = unit(k, Op::backward);
    const int v = a.chunk * P + stage;
    if (v < last_v) list.push_back({Op::recv_grad, a.mb, a.chunk});
    list.push_back(a);
    if (v > 0) list.push_back({Op::send_grad, a.mb, a.chunk});
  };
  // Stage s needs 2(P-1-s) chunk-forwards more than the last stage before its first gradient can
  // come back, and every stage runs the first group through all but its last chunk first.
  const int warmup = M == P ? total : std::min(total, 2 * (P - 1 - stage) + (V - 1) * P);
  for (int k = 0; k < warmup; ++k) forward(k);
  for (int k = 0; k + warmup < total; ++k) forward(k + warmup), backward(k);
  for (int k = std::max(0, total - warmup); k < total; ++k) backward(k);
  return list;
}

ActionList make_schedule(const std::string& name, int stage, int n_stages, int micro_batches, int chunks) {
  if (name == "interleaved") return interleaved_schedule(stage, n_stages, micro_batches, chunks);
  if (chunks != 1) throw std::invalid_argument("schedule " + name + " runs one chunk per stage");
  if (name == "gpipe") return gpipe_schedule(stage, n_stages, micro_batches);
  if (name == "1f1b") return one_f_one_b_schedule(stage, n_stages, micro_batches);
  if (name == "zb-h1") return zb_h1_schedule(stage, n_stages, micro_batches);
  throw std::invalid_argument("unknown schedule " + name);
}

ActionList forward_only(const ActionList& list) {
  ActionList out;
  for (const Action& a : list)
    if (a.op == Op::recv_act || a.op == Op::forward || a.op == Op::send_act) out.push_back(a);
  return out;
}

double schedule_bubble(const std::string& name, int n_stages, int micro_batches, int chunks) {
  const int P = n_stages, M = micro_batches;
  if (name == "interleaved") return static_cast<double>(P - 1) / (chunks * M + P - 1);
  if (name != "zb-h1") return static_cast<double>(P - 1) / (M + P - 1);
  std::vector<ActionList> lists;
  for (int s = 0; s < P; ++s) lists.push_back(zb_h1_schedule(s, P, M));
  const std::vector<double> one(P, 1.0), two(P, 2.0);
  return 1.0 - 3.0 * M / simulate(lists, one, two, one).makespan;
}

int max_in_flight(const ActionList& list) {
  int now = 0, peak = 0;
  for (const Action& a : list) {
    if (a.op == Op::forward) peak = std::max(peak, ++now);
    if (a.op == Op::backward || a.op == Op::backward_weight) --now;
  }
  return peak;
}

size_t peak_activation_bytes(const ActionList& list, const std::vector<size_t>& stash, const std::vector<size_t>& wgrads) {
  size_t now = 0, peak = 0;
  for (const Action& a : list) {
    const size_t held = stash.at(a.chunk), split = wgrads.at(a.chunk);
    if (a.op == Op::forward) now += held;
    if (a.op == Op::backward_input) now += split;
    if (a.op == Op::backward) now -= held;
    if (a.op == Op::backward_weight) now -= held + split;
    peak = std::max(peak, now);
  }
  return peak;
}

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
  size_t width = 4;  // the seed's columns; wider for chunk labels such as "B12.1"
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

std::string to_string(const Action& a) {
  static const char* names[] = {"recvA", "F", "sendA", "recvG", "B", "sendG", "B", "W"};
  return names[static_cast<int>(a.op)] + std::to_string(a.mb) + (a.chunk ? "." + std::to_string(a.chunk) : "");
}

}  // namespace pipetrain
