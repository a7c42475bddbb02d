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

namespace {

// 1F1B's order on one stage: min(P-1-s, M) warm-up forwards, then one forward and one backward
// alternately, then the remaining backwards. weight_lag < 0: fused backwards. Otherwise each
// backward is split, and W of micro-batch i runs right after B of micro-batch i + weight_lag (the
// last weight_lag W's at the end).
ActionList one_f_one_b_order(int stage, int n_stages, int micro_batches, int weight_lag) {
  const bool first = stage == 0, last = stage == n_stages - 1, split = weight_lag >= 0;
  const int M = micro_batches;
  ActionList list;
  auto forward = [&](int i) {
    if (!first) list.push_back({Op::recv_act, i});
    list.push_back({Op::forward, i});
    if (!last) list.push_back({Op::send_act, i});
  };
  auto backward = [&](int i) {
    if (!last) list.push_back({Op::recv_grad, i});
    list.push_back({split ? Op::backward_input : Op::backward, i});
    if (!first) list.push_back({Op::send_grad, i});
    if (split && i >= weight_lag) list.push_back({Op::backward_weight, i - weight_lag});
  };
  // Stage s must run P-1-s forwards before the first gradient can come back to it.
  const int warmup = std::min(n_stages - 1 - stage, M);
  for (int i = 0; i < warmup; ++i) forward(i);
  for (int i = 0; i < M; ++i) {
    if (i + warmup < M) forward(i + warmup);
    backward(i);
  }
  if (split)
    for (int i = std::max(0, M - weight_lag); i < M; ++i) list.push_back({Op::backward_weight, i});
  return list;
}

}  // namespace

ActionList one_f_one_b_schedule(int stage, int n_stages, int micro_batches) {
  return one_f_one_b_order(stage, n_stages, micro_batches, -1);
}

ActionList zb_h1_schedule(int stage, int n_stages, int micro_batches) {
  // Stage s runs each W s micro-batches late. With unit costs a B then runs one slot after the next
  // stage's B of the same micro-batch: the first gradients climb the pipeline one slot per stage (B
  // alone, not 1F1B's B + W), so stage 0 waits P - 1 slots less for its first one. At the end,
  // stage s runs its last B s slots before stage 0 runs its own, and the lag leaves it exactly the
  // s + 1 W's that fill those slots and the one of stage 0's last W. So after its first forward no
  // stage waits beyond 1F1B's warm-up (P - 1 - s slots): 3M + P - 1 slots in all for M >= P.
  return one_f_one_b_order(stage, n_stages, micro_batches, stage);
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
  for (int k = 0; k + warmup < total; ++k) {
    forward(k + warmup);
    backward(k);
  }
  for (int k = std::max(0, total - warmup); k < total; ++k) backward(k);
  return list;
}

}  // namespace pipetrain
