#include "pipetrain/schedule/v_schedules.hpp"

#include <deque>
#include <stdexcept>
#include <vector>

#include "pipetrain/schedule/placement.hpp"

namespace pipetrain {
namespace {

// A per-rank order of F, B and W (chunk, micro-batch), completed with the receives and sends the
// vee needs: a forward receives from the previous virtual stage unless it is the first and sends
// to the next unless it is the last; a backward the other way round.
ActionList with_messages(const std::vector<Action>& order, const ChunkPlacement& place, int stage) {
  const int last = place.virtual_stages() - 1;
  ActionList list;
  for (const Action& a : order) {
    const int v = place.vstage(stage, a.chunk);
    if (a.op == Op::forward && v > 0) list.push_back({Op::recv_act, a.mb, a.chunk});
    if ((a.op == Op::backward_input || a.op == Op::backward) && v < last)
      list.push_back({Op::recv_grad, a.mb, a.chunk});
    list.push_back(a);
    if (a.op == Op::forward && v < last) list.push_back({Op::send_act, a.mb, a.chunk});
    if ((a.op == Op::backward_input || a.op == Op::backward) && v > 0) list.push_back({Op::send_grad, a.mb, a.chunk});
  }
  return list;
}

}  // namespace

ActionList zb_v_schedule(int stage, int n_stages, int micro_batches) {
  const int P = n_stages, M = micro_batches, n_virtual = 2 * P, cap = 2 * P;
  const ChunkPlacement place{P, 2, Placement::vee};
  // done_f[v][mb] / done_b[v][mb]: the slot after which that virtual stage's F / B of the
  // micro-batch is finished (-1: not yet), so readiness follows the pipeline's data dependencies.
  std::vector<std::vector<int>> done_f(n_virtual, std::vector<int>(M, -1)), done_b = done_f;
  auto finished = [](int at, int t) { return at >= 0 && at <= t; };
  struct RankState {
    int next_f[2] = {0, 0}, next_b[2] = {0, 0}, held = 0;
    std::deque<Action> pending_w;
    std::vector<Action> order;
  };
  std::vector<RankState> ranks(P);
  for (int t = 0, left = 6 * P * M; left > 0; ++t) {
    if (t > 12 * P * M + 4 * P) throw std::logic_error("zb-v: the list scheduler made no progress");
    for (int s = 0; s < P; ++s) {
      RankState& r = ranks[s];
      auto b_ready = [&](int c) {
        const int mb = r.next_b[c], v = place.vstage(s, c);
        return mb < M && finished(done_f[v][mb], t) && (v == n_virtual - 1 || finished(done_b[v + 1][mb], t));
      };
      auto f_ready = [&](int c) {
        const int mb = r.next_f[c], v = place.vstage(s, c);
        return mb < M && r.held < cap && (v == 0 || finished(done_f[v - 1][mb], t));
      };
      // The later chunk first: it is nearer the head going forward and nearer the loss going back.
      const int b_chunk = b_ready(1) ? 1 : b_ready(0) ? 0 : -1;
      const int f_chunk = f_ready(1) ? 1 : f_ready(0) ? 0 : -1;
      if (b_chunk >= 0) {
        const int mb = r.next_b[b_chunk]++;
        done_b[place.vstage(s, b_chunk)][mb] = t + 1;
        r.order.push_back({Op::backward_input, mb, b_chunk});
        r.pending_w.push_back({Op::backward_weight, mb, b_chunk});
      } else if (f_chunk >= 0) {
        const int mb = r.next_f[f_chunk]++;
        done_f[place.vstage(s, f_chunk)][mb] = t + 1;
        r.order.push_back({Op::forward, mb, f_chunk});
        ++r.held;
      } else if (!r.pending_w.empty()) {
        r.order.push_back(r.pending_w.front());
        r.pending_w.pop_front();
        --r.held;
      } else {
        continue;  // idle this slot
      }
      --left;
    }
  }
  return with_messages(ranks[stage].order, place, stage);
}

ActionList dualpipe_v_schedule(int stage, int n_stages, int micro_batches) {
  const int P = n_stages, M = micro_batches, s = stage;
  if (M < 2 * P) throw std::invalid_argument("dualpipev needs micro_batches >= 2 x pp");
  std::vector<Action> order;
  int next_f[2] = {0, 0}, next_b[2] = {0, 0};
  std::deque<Action> pending_w;
  bool split = false;  // the cool-down's backwards run as B now, W later
  auto forward = [&](int c) { order.push_back({Op::forward, next_f[c]++, c}); };
  auto backward = [&](int c) {
    const int mb = next_b[c]++;
    if (!split) return order.push_back({Op::backward, mb, c});
    order.push_back({Op::backward_input, mb, c});
    pending_w.push_back({Op::backward_weight, mb, c});
  };
  auto weight = [&] {
    if (pending_w.empty()) return;
    order.push_back(pending_w.front());
    pending_w.pop_front();
  };
  auto pair = [&](int forward_chunk) {
    forward(forward_chunk);
    backward(1 - forward_chunk);
  };
  for (int i = 0; i < 2 * (P - 1 - s); ++i) forward(0);  // chunk 0 fills the way down
  for (int i = 0; i <= s; ++i) {                         // both chunks, the turn reached
    forward(0);
    forward(1);
  }
  split = true;
  for (int i = 0; i < P - 1 - s; ++i) {  // chunk 1's first backwards
    backward(1);
    weight();
    forward(1);
  }
  split = false;
  for (int i = 0; i < M - 2 * P + s + 1; ++i) {  // steady state: F with the other's B
    pair(0);
    pair(1);
  }
  for (int i = 0; i < P - 1 - s; ++i) {  // chunk 0's forwards are done
    backward(1);
    pair(1);
  }
  for (int i = 0; i <= s; ++i) {                       // the last backwards, B and W
    if (i == (s + 1) / 2 && s % 2 == 1) split = true;  // apart from the middle on
    backward(1);
    if (i == (s + 1) / 2 && s % 2 == 0) split = true;
    backward(0);
  }
  for (int i = 0; i < P - 1 - s; ++i) {
    weight();
    backward(0);
  }
  while (!pending_w.empty()) weight();
  return with_messages(order, ChunkPlacement{P, 2, Placement::vee}, stage);
}

}  // namespace pipetrain
