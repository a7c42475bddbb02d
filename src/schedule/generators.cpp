#include "pipetrain/schedule/generators.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

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

}  // namespace pipetrain
