// GPipe schedule as data: per-stage order, matching sends/receives between neighbours, and a
// small discrete-event simulation that checks the bubble formula (P-1)/(M+P-1).
#include <catch2/catch.hpp>

#include <algorithm>
#include <stdexcept>

#include "pipetrain/schedule.hpp"

using namespace pipetrain;

namespace {

std::vector<ActionList> all_stages(int P, int M) {
  std::vector<ActionList> lists;
  for (int s = 0; s < P; ++s) lists.push_back(gpipe_schedule(s, P, M));
  return lists;
}

std::vector<Action> only(const ActionList& list, Op op) {
  std::vector<Action> out;
  for (auto& a : list)
    if (a.op == op) out.push_back(a);
  return out;
}

std::vector<int> mbs(const std::vector<Action>& acts) {
  std::vector<int> out;
  for (auto& a : acts) out.push_back(a.mb);
  return out;
}

std::vector<int> range(int from, int to, int step) {  // [from, to) with step, or (to, from] descending
  std::vector<int> out;
  for (int i = from; step > 0 ? i < to : i > to; i += step) out.push_back(i);
  return out;
}

// Discrete-event run of all stages' lists: forward/backward take 1 time unit, send/recv take 0, a
// receive completes no earlier than its matching send (same op pair and micro-batch, from the
// neighbour). Sends are buffered (never block).
struct SimResult {
  bool deadlock = false;
  double makespan = 0;
  std::vector<double> busy, clock;
};

SimResult simulate(const std::vector<ActionList>& lists) {
  const int P = static_cast<int>(lists.size());
  // sent[s][mb]: time stage s sent activation (acts) or gradient (grads) of mb, -1 if not yet.
  std::vector<std::vector<double>> sent_act(P), sent_grad(P);
  for (int s = 0; s < P; ++s) {
    int max_mb = 0;
    for (auto& a : lists[s]) max_mb = std::max(max_mb, a.mb);
    sent_act[s].assign(max_mb + 1, -1);
    sent_grad[s].assign(max_mb + 1, -1);
  }
  auto sent_time = [&](std::vector<std::vector<double>>& table, int stage, int mb) {
    if (stage < 0 || stage >= P || mb >= static_cast<int>(table[stage].size())) return -1.0;
    return table[stage][mb];
  };
  SimResult r;
  r.busy.assign(P, 0);
  r.clock.assign(P, 0);
  std::vector<size_t> pc(P, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s)
      while (pc[s] < lists[s].size()) {
        const Action a = lists[s][pc[s]];
        if (a.op == Op::forward || a.op == Op::backward) {
          r.clock[s] += 1;
          r.busy[s] += 1;
        } else if (a.op == Op::send_act) {
          sent_act[s][a.mb] = r.clock[s];
        } else if (a.op == Op::send_grad) {
          sent_grad[s][a.mb] = r.clock[s];
        } else {
          double t = a.op == Op::recv_act ? sent_time(sent_act, s - 1, a.mb) : sent_time(sent_grad, s + 1, a.mb);
          if (t < 0) break;  // blocked until the neighbour sends
          r.clock[s] = std::max(r.clock[s], t);
        }
        ++pc[s];
        progress = true;
      }
  }
  for (int s = 0; s < P; ++s) r.deadlock |= pc[s] != lists[s].size();
  r.makespan = *std::max_element(r.clock.begin(), r.clock.end());
  return r;
}

const std::pair<int, int> kShapes[] = {{1, 1}, {1, 4}, {2, 1}, {2, 3}, {3, 5}, {4, 4},
                                       {4, 8}, {5, 2}, {8, 16}, {7, 3}};

}  // namespace

TEST_CASE("gpipe: M forwards then M backwards in reverse order on every stage", "[schedule]") {
  const int P = 4, M = 4;
  for (int s = 0; s < P; ++s) {
    INFO("stage " << s);
    ActionList list = gpipe_schedule(s, P, M);
    std::vector<Action> compute;
    for (auto& a : list)
      if (a.op == Op::forward || a.op == Op::backward) compute.push_back(a);
    std::vector<Action> want = {{Op::forward, 0},  {Op::forward, 1},  {Op::forward, 2},  {Op::forward, 3},
                                {Op::backward, 3}, {Op::backward, 2}, {Op::backward, 1}, {Op::backward, 0}};
    CHECK(compute == want);
  }
  // The middle stage in full: each forward wrapped by its receive and send, same for backward.
  ActionList s1 = gpipe_schedule(1, P, 2);
  ActionList want1 = {{Op::recv_act, 0},  {Op::forward, 0},  {Op::send_act, 0},  {Op::recv_act, 1},
                      {Op::forward, 1},   {Op::send_act, 1}, {Op::recv_grad, 1}, {Op::backward, 1},
                      {Op::send_grad, 1}, {Op::recv_grad, 0}, {Op::backward, 0}, {Op::send_grad, 0}};
  CHECK(s1 == want1);
}

TEST_CASE("gpipe: the first stage never receives activations and the last never sends them", "[schedule]") {
  for (auto [P, M] : kShapes) {
    INFO("P=" << P << " M=" << M);
    auto lists = all_stages(P, M);
    CHECK(only(lists[0], Op::recv_act).empty());
    CHECK(only(lists[0], Op::send_grad).empty());
    CHECK(only(lists[P - 1], Op::send_act).empty());
    CHECK(only(lists[P - 1], Op::recv_grad).empty());
    for (int s = 0; s < P; ++s) {
      CHECK(mbs(only(lists[s], Op::forward)) == range(0, M, 1));
      CHECK(mbs(only(lists[s], Op::backward)) == range(M - 1, -1, -1));
      if (s > 0) CHECK(only(lists[s], Op::recv_act).size() == static_cast<size_t>(M));
      if (s + 1 < P) CHECK(only(lists[s], Op::recv_grad).size() == static_cast<size_t>(M));
    }
  }
}

TEST_CASE("gpipe: sends on one stage match receives on its neighbour in the same order", "[schedule]") {
  for (auto [P, M] : kShapes) {
    INFO("P=" << P << " M=" << M);
    auto lists = all_stages(P, M);
    for (int s = 1; s < P; ++s) {
      INFO("link " << s - 1 << " -> " << s);
      CHECK(mbs(only(lists[s - 1], Op::send_act)) == mbs(only(lists[s], Op::recv_act)));
      CHECK(mbs(only(lists[s], Op::send_grad)) == mbs(only(lists[s - 1], Op::recv_grad)));
    }
  }
}

TEST_CASE("gpipe: each stage receives before computing and computes before sending", "[schedule]") {
  for (auto [P, M] : kShapes)
    for (int s = 0; s < P; ++s) {
      INFO("P=" << P << " M=" << M << " stage " << s);
      ActionList list = gpipe_schedule(s, P, M);
      auto pos = [&](Op op, int mb) {
        return std::find(list.begin(), list.end(), Action{op, mb}) - list.begin();
      };
      for (int i = 0; i < M; ++i) {
        if (s > 0) CHECK(pos(Op::recv_act, i) < pos(Op::forward, i));
        if (s + 1 < P) CHECK(pos(Op::forward, i) < pos(Op::send_act, i));
        CHECK(pos(Op::forward, i) < pos(Op::backward, i));
        if (s + 1 < P) CHECK(pos(Op::recv_grad, i) < pos(Op::backward, i));
        if (s > 0) CHECK(pos(Op::backward, i) < pos(Op::send_grad, i));
      }
    }
}

TEST_CASE("simulator detects a deadlock", "[schedule]") {
  // Stage 0 waits for a gradient before it sends the activation stage 1 needs.
  std::vector<ActionList> lists = {
      {{Op::forward, 0}, {Op::recv_grad, 0}, {Op::send_act, 0}, {Op::backward, 0}},
      {{Op::recv_act, 0}, {Op::forward, 0}, {Op::backward, 0}, {Op::send_grad, 0}}};
  CHECK(simulate(lists).deadlock);
  std::swap(lists[0][1], lists[0][2]);
  CHECK_FALSE(simulate(lists).deadlock);
}

TEST_CASE("gpipe: simulated makespan and bubble match the seed's formula", "[schedule]") {
  for (auto [P, M] : kShapes) {
    INFO("P=" << P << " M=" << M);
    SimResult r = simulate(all_stages(P, M));
    REQUIRE_FALSE(r.deadlock);
    CHECK(r.makespan == 2.0 * (M + P - 1));
    const double bubble = double(P - 1) / (M + P - 1);
    for (int s = 0; s < P; ++s) {
      INFO("stage " << s);
      CHECK(r.busy[s] == 2.0 * M);
      CHECK((r.makespan - r.busy[s]) / r.makespan == Approx(bubble).margin(1e-12));
      CHECK(r.clock[s] == 2.0 * (M + P - 1) - s);  // stage s finishes its last backward s units early
    }
  }
}

TEST_CASE("make_schedule dispatches by name and actions print compactly", "[schedule]") {
  CHECK(make_schedule("gpipe", 1, 3, 4) == gpipe_schedule(1, 3, 4));
  CHECK_THROWS_AS(make_schedule("1f1b-typo", 0, 2, 2), std::invalid_argument);
  CHECK(to_string({Op::forward, 3}) == "F3");
  CHECK(to_string({Op::backward, 0}) == "B0");
  CHECK(to_string({Op::recv_act, 2}) == "recvA2");
  CHECK(to_string({Op::send_grad, 1}) == "sendG1");
}
