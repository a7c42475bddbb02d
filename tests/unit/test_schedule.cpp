// Schedules as data (GPipe, 1F1B, interleaved, ZB-H1): per-stage order, matching sends/receives
// between neighbours, and a small discrete-event simulation that checks the bubble formulas.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <stdexcept>

#include "pipetrain/schedule/generators.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"

using namespace pipetrain;

namespace {

// A registered schedule's list for one stage, and its bubble with even stages.
ActionList make_schedule(const std::string& name, int stage, int P, int M, int V = 1) {
  return schedule_named(name).generate(stage, {P, M, V, P * V});
}
double schedule_bubble(const std::string& name, int P, int M, int V = 1) {
  return schedule_named(name).bubble({P, M, V, P * V});
}

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

// Unit costs: every forward and backward takes one time slot, as in the classic GPipe diagrams.
SimResult simulate_unit(const std::vector<ActionList>& lists) {
  const std::vector<double> one(lists.size(), 1.0);
  return simulate(lists, one, one);
}

const std::pair<int, int> kShapes[] = {{1, 1}, {1, 4}, {2, 1}, {2, 3}, {3, 5}, {4, 4}, {4, 8}, {5, 2}, {8, 16}, {7, 3}};

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
  ActionList want1 = {{Op::recv_act, 0},  {Op::forward, 0},   {Op::send_act, 0},  {Op::recv_act, 1},
                      {Op::forward, 1},   {Op::send_act, 1},  {Op::recv_grad, 1}, {Op::backward, 1},
                      {Op::send_grad, 1}, {Op::recv_grad, 0}, {Op::backward, 0},  {Op::send_grad, 0}};
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
      auto pos = [&](Op op, int mb) { return std::find(list.begin(), list.end(), Action{op, mb}) - list.begin(); };
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
  std::vector<ActionList> lists = {{{Op::forward, 0}, {Op::recv_grad, 0}, {Op::send_act, 0}, {Op::backward, 0}},
                                   {{Op::recv_act, 0}, {Op::forward, 0}, {Op::backward, 0}, {Op::send_grad, 0}}};
  CHECK_THROWS_AS(simulate_unit(lists), std::logic_error);
  std::swap(lists[0][1], lists[0][2]);
  CHECK_NOTHROW(simulate_unit(lists));
}

TEST_CASE("gpipe: simulated makespan and bubble match the closed form (P-1)/(M+P-1)", "[schedule]") {
  for (auto [P, M] : kShapes) {
    INFO("P=" << P << " M=" << M);
    SimResult r = simulate_unit(all_stages(P, M));
    CHECK(r.makespan == 2.0 * (M + P - 1));
    const double bubble = double(P - 1) / (M + P - 1);
    for (int s = 0; s < P; ++s) {
      INFO("stage " << s);
      CHECK(r.busy[s] == 2.0 * M);
      CHECK((r.makespan - r.busy[s]) / r.makespan == Approx(bubble).margin(1e-12));
      CHECK(r.bubble[s] == Approx(bubble).margin(1e-12));
      CHECK(r.spans[s].back().end == 2.0 * (M + P - 1) - s);  // stage s finishes its last backward s units early
    }
  }
}

TEST_CASE("bubble equals (P-1)/(M+P-1) exactly on a grid of P and M", "[schedule]") {
  for (int P = 1; P <= 8; ++P)
    for (int M : {1, 2, 3, 4, 8, 16, 32, 64}) {
      INFO("P=" << P << " M=" << M);
      CHECK(simulate_unit(all_stages(P, M)).mean_bubble() * (M + P - 1) == Approx(P - 1).margin(1e-9));
    }
}

TEST_CASE("the text chart for P=4, M=4 is the classic GPipe slot diagram, slot for slot", "[schedule]") {
  // The GPipe diagram with four stages and four micro-batches, as it is usually drawn.
  const std::string seed =
      "t:        0   1   2   3   4   5   6   7   8   9   10  11  12  13\n"
      "Stage 0:  F0  F1  F2  F3  \u00b7   \u00b7   \u00b7   \u00b7   \u00b7   \u00b7   B3  B2  B1  B0\n"
      "Stage 1:  \u00b7   F0  F1  F2  F3  \u00b7   \u00b7   \u00b7   \u00b7   B3  B2  B1  B0  \u00b7\n"
      "Stage 2:  \u00b7   \u00b7   F0  F1  F2  F3  \u00b7   \u00b7   B3  B2  B1  B0  \u00b7   \u00b7\n"
      "Stage 3:  \u00b7   \u00b7   \u00b7   F0  F1  F2  F3  B3  B2  B1  B0  \u00b7   \u00b7   \u00b7\n";
  CHECK(render_chart(simulate_unit(all_stages(4, 4))) == seed);
  // The naive pipeline (M = 1): one micro-batch passes the stages one after the other.
  const std::string naive =
      "t:        0   1   2   3   4   5   6   7\n"
      "Stage 0:  F0  \u00b7   \u00b7   \u00b7   \u00b7   \u00b7   \u00b7   B0\n"
      "Stage 1:  \u00b7   F0  \u00b7   \u00b7   \u00b7   \u00b7   B0  \u00b7\n"
      "Stage 2:  \u00b7   \u00b7   F0  \u00b7   \u00b7   B0  \u00b7   \u00b7\n"
      "Stage 3:  \u00b7   \u00b7   \u00b7   F0  B0  \u00b7   \u00b7   \u00b7\n";
  CHECK(render_chart(simulate_unit(all_stages(4, 1))) == naive);
  CHECK(render_chart(simulate_unit(all_stages(4, 64)), 64).empty());  // too wide: omitted
}

TEST_CASE("make_schedule dispatches by name and actions print compactly", "[schedule]") {
  CHECK(make_schedule("gpipe", 1, 3, 4) == gpipe_schedule(1, 3, 4));
  CHECK(make_schedule("1f1b", 1, 3, 4) == one_f_one_b_schedule(1, 3, 4));
  CHECK(make_schedule("zb-h1", 1, 3, 4) == zb_h1_schedule(1, 3, 4));
  CHECK(to_string({Op::backward_input, 2}) == "B2");
  CHECK(to_string({Op::backward_weight, 2}) == "W2");
  CHECK_THROWS_AS(make_schedule("1f1b-typo", 0, 2, 2), std::invalid_argument);
  CHECK(to_string({Op::forward, 3}) == "F3");
  CHECK(to_string({Op::backward, 0}) == "B0");
  CHECK(to_string({Op::recv_act, 2}) == "recvA2");
  CHECK(to_string({Op::send_grad, 1}) == "sendG1");
}

// ---- 1F1B and properties every generator must have ----

namespace {

std::vector<ActionList> lists_of(const std::string& name, int P, int M) {
  std::vector<ActionList> lists;
  for (int s = 0; s < P; ++s) lists.push_back(make_schedule(name, s, P, M));
  return lists;
}

}  // namespace

TEST_CASE("every schedule: each micro-batch's F and B once per stage, F before B, sends match receives, no deadlock",
          "[schedule]") {
  for (const std::string name : {"gpipe", "1f1b", "zb-h1"})
    for (int P = 1; P <= 6; ++P)
      for (int M = 1; M <= 12; ++M) {
        INFO(name << " P=" << P << " M=" << M);
        const auto lists = lists_of(name, P, M);
        const bool split = name == "zb-h1";
        const Op backward = split ? Op::backward_input : Op::backward;
        for (int s = 0; s < P; ++s) {
          auto f = mbs(only(lists[s], Op::forward)), b = mbs(only(lists[s], backward));
          auto w = mbs(only(lists[s], Op::backward_weight));
          std::sort(f.begin(), f.end());
          std::sort(b.begin(), b.end());
          std::sort(w.begin(), w.end());
          REQUIRE(f == range(0, M, 1));
          REQUIRE(b == range(0, M, 1));
          REQUIRE(w == (split ? range(0, M, 1) : std::vector<int>{}));
          REQUIRE(only(lists[s], split ? Op::backward : Op::backward_input).empty());  // fused xor split
          for (int mb = 0; mb < M; ++mb) {
            auto at = [&](Op op) {
              return std::find(lists[s].begin(), lists[s].end(), Action{op, mb}) - lists[s].begin();
            };
            REQUIRE(at(Op::forward) < at(backward));
            if (split) REQUIRE(at(backward) < at(Op::backward_weight));
          }
          if (s + 1 < P) {  // what s sends, s+1 receives, in the same order (tags cannot cross)
            REQUIRE(mbs(only(lists[s], Op::send_act)) == mbs(only(lists[s + 1], Op::recv_act)));
            REQUIRE(mbs(only(lists[s + 1], Op::send_grad)) == mbs(only(lists[s], Op::recv_grad)));
          }
        }
        const SimResult sim = simulate_unit(lists);  // throws on a deadlock
        if (!split) CHECK(sim.makespan == Approx(2.0 * (M + P - 1)));
      }
}

namespace {

// Most micro-batches whose forward has run and whose B has not: how the Zero Bubble paper counts
// activation memory (most of a micro-batch's activations can go after B). Ours, max_in_flight,
// counts until W, where the Stage releases them.
int max_awaiting_b(const ActionList& list) {
  int now = 0, peak = 0;
  for (const Action& a : list) {
    if (a.op == Op::forward) peak = std::max(peak, ++now);
    if (a.op == Op::backward_input) --now;
  }
  return peak;
}

}  // namespace

TEST_CASE("zb-h1: the paper's ZB-H1 makespan with F = B = W, 3M + P - 1 for M >= P", "[schedule]") {
  for (int P = 1; P <= 6; ++P)
    for (int M = 1; M <= 12; ++M) {
      INFO("P=" << P << " M=" << M);
      const std::vector<double> one(P, 1.0), two(P, 2.0);
      const double zb = simulate(lists_of("zb-h1", P, M), one, two, one).makespan;
      const double ofob = simulate(lists_of("1f1b", P, M), one, two).makespan;  // W right after B
      CHECK(ofob == Approx(3.0 * (M + P - 1)));
      // Bubble (P-1)(F + B - W) against 1F1B's (P-1)(F + B + W); below, the last micro-batch's
      // F, B and W chains bound it.
      CHECK(zb == Approx(M >= P ? 3 * M + P - 1 : 2 * M + 2 * P - 1));
      if (P > 1) CHECK(zb < ofob);
    }
  // Other costs with W no dearer than F or B: each stage idles (P-1)(F + B - W), the paper's figure.
  for (auto [f, b, w] : {std::array<double, 3>{2, 2, 1}, {2, 3, 2}, {3, 2, 2}, {1, 2, 1}})
    for (int P = 2; P <= 6; ++P)
      for (int M = P; M <= 12; ++M) {
        INFO("F=" << f << " B=" << b << " W=" << w << " P=" << P << " M=" << M);
        const std::vector<double> fwd(P, f), bwd(P, b + w), wgt(P, w);
        const double makespan = simulate(lists_of("zb-h1", P, M), fwd, bwd, wgt).makespan;
        CHECK(makespan == Approx(M * (f + b + w) + (P - 1) * (f + b - w)));
      }
}

TEST_CASE("zb-h1: every list runs each F, B and W once, in that order, with its messages, and no deadlock",
          "[schedule]") {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 16; ++M) {
      INFO("P=" << P << " M=" << M);
      const auto lists = lists_of("zb-h1", P, M);
      for (int s = 0; s < P; ++s) {
        const ActionList& l = lists[s];
        const bool first = s == 0, last = s == P - 1;
        CHECK(l.size() == static_cast<size_t>(M) * (3 + 2 * !first + 2 * !last));
        for (int mb = 0; mb < M; ++mb) {
          auto at = [&](Op op) {
            REQUIRE(std::count(l.begin(), l.end(), Action{op, mb}) == 1);
            return std::find(l.begin(), l.end(), Action{op, mb}) - l.begin();
          };
          const auto f = at(Op::forward), b = at(Op::backward_input), w = at(Op::backward_weight);
          CHECK(f < b);
          CHECK(b < w);
          // recv_act right before F, send_act right after it; recv_grad / send_grad around B
          if (!first) CHECK(at(Op::recv_act) == f - 1);
          if (!last) CHECK(at(Op::send_act) == f + 1);
          if (!last) CHECK(at(Op::recv_grad) == b - 1);
          if (!first) CHECK(at(Op::send_grad) == b + 1);
        }
      }
      const std::vector<double> one(P, 1.0), two(P, 2.0);
      CHECK_NOTHROW(simulate(lists, one, two, one));
    }
}

TEST_CASE("zb-h1: 1F1B's P - s micro-batches between F and B (the paper's count), min(M, P) until W", "[schedule]") {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 16; ++M)
      for (int s = 0; s < P; ++s) {
        INFO("P=" << P << " M=" << M << " stage " << s);
        const ActionList zb = zb_h1_schedule(s, P, M);
        CHECK(max_awaiting_b(zb) == max_in_flight(one_f_one_b_schedule(s, P, M)));
        CHECK(max_in_flight(zb) == std::min(M, P));
      }
}

TEST_CASE("zb-h1: P=4, M=8 chart is the paper's ZB-H1, 27 slots", "[schedule]") {
  // 1F1B's forwards and B's; stage s runs W of micro-batch i after B of i + s, the last s at the end.
  const std::string want =
      "t:        0   1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17  18  19  20  21  22  23  24  "
      "25  26\n"
      "Stage 0:  F0  F1  F2  F3  ·   ·   ·   B0  W0  F4  B1  W1  F5  B2  W2  F6  B3  W3  F7  B4  W4  B5  W5  B6  W6  "
      "B7  W7\n"
      "Stage 1:  ·   F0  F1  F2  ·   ·   B0  F3  B1  W0  F4  B2  W1  F5  B3  W2  F6  B4  W3  F7  B5  W4  B6  W5  B7  "
      "W6  W7\n"
      "Stage 2:  ·   ·   F0  F1  ·   B0  F2  B1  F3  B2  W0  F4  B3  W1  F5  B4  W2  F6  B5  W3  F7  B6  W4  B7  W5  "
      "W6  W7\n"
      "Stage 3:  ·   ·   ·   F0  B0  F1  B1  F2  B2  F3  B3  W0  F4  B4  W1  F5  B5  W2  F6  B6  W3  F7  B7  W4  W5  "
      "W6  W7\n";
  const std::vector<double> one(4, 1.0), two(4, 2.0);
  CHECK(render_chart(simulate(lists_of("zb-h1", 4, 8), one, two, one)) == want);
}

TEST_CASE("1f1b: a stage holds at most P - stage micro-batches, GPipe all M", "[schedule]") {
  for (int P = 1; P <= 6; ++P)
    for (int M = 1; M <= 12; ++M)
      for (int s = 0; s < P; ++s) {
        INFO("P=" << P << " M=" << M << " stage " << s);
        CHECK(max_in_flight(one_f_one_b_schedule(s, P, M)) == std::min(M, P - s));
        CHECK(max_in_flight(gpipe_schedule(s, P, M)) == M);
      }
}

TEST_CASE("1f1b: P=4, M=8 chart is the PipeDream-Flush diagram", "[schedule]") {
  // Warm-up of P-1-s forwards, then forward/backward pairs, then the last backwards.
  const std::string want =
      "t:        0   1   2   3   4   5   6   7   8   9   10  11  12  13  14  15  16  17  18  19  20  21\n"
      "Stage 0:  F0  F1  F2  F3  ·   ·   ·   B0  F4  B1  F5  B2  F6  B3  F7  B4  ·   B5  ·   B6  ·   B7\n"
      "Stage 1:  ·   F0  F1  F2  ·   ·   B0  F3  B1  F4  B2  F5  B3  F6  B4  F7  B5  ·   B6  ·   B7  ·\n"
      "Stage 2:  ·   ·   F0  F1  ·   B0  F2  B1  F3  B2  F4  B3  F5  B4  F6  B5  F7  B6  ·   B7  ·   ·\n"
      "Stage 3:  ·   ·   ·   F0  B0  F1  B1  F2  B2  F3  B3  F4  B4  F5  B5  F6  B6  F7  B7  ·   ·   ·\n";
  CHECK(render_chart(simulate_unit(lists_of("1f1b", 4, 8))) == want);
}

TEST_CASE("schedule_bubble: the closed form for gpipe and 1f1b, zb-h1's with F = B = W", "[schedule]") {
  CHECK(schedule_bubble("gpipe", 4, 8) == Approx(3.0 / 11));
  CHECK(schedule_bubble("1f1b", 4, 8) == Approx(3.0 / 11));
  CHECK(schedule_bubble("zb-h1", 4, 8) == Approx(3.0 / 27));  // 27 slots for 24 of work
  CHECK(schedule_bubble("zb-h1", 1, 8) == Approx(0.0));
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 16; ++M) {  // the closed form is what its lists take
      INFO("P=" << P << " M=" << M);
      const std::vector<double> one(P, 1.0), two(P, 2.0);
      const double makespan = simulate(lists_of("zb-h1", P, M), one, two, one).makespan;
      CHECK(schedule_bubble("zb-h1", P, M) == Approx(1 - 3.0 * M / makespan));
      if (P > 1) CHECK(schedule_bubble("zb-h1", P, M) < schedule_bubble("1f1b", P, M));
    }
}

// ---- interleaved 1F1B: V chunks per rank, virtual stage v = chunk * P + stage ----

namespace {

std::vector<ActionList> interleaved(int P, int M, int V) {
  std::vector<ActionList> lists;
  for (int s = 0; s < P; ++s) lists.push_back(make_schedule("interleaved", s, P, M, V));
  return lists;
}

// (virtual stage, micro-batch) of each action of one kind on rank s, in list order.
std::vector<std::pair<int, int>> units(const ActionList& list, Op op, int P, int s) {
  std::vector<std::pair<int, int>> out;
  for (auto& a : list)
    if (a.op == op) out.push_back({a.chunk * P + s, a.mb});
  return out;
}

}  // namespace

TEST_CASE("interleaved: every chunk runs each micro-batch once, sends match receives round the ring, no deadlock",
          "[schedule]") {
  for (int V = 2; V <= 4; ++V)
    for (int P = 2; P <= 6; ++P)
      for (int M = P; M <= 3 * P; M += P) {
        INFO("P=" << P << " M=" << M << " V=" << V);
        const auto lists = interleaved(P, M, V);
        for (int s = 0; s < P; ++s) {
          auto f = units(lists[s], Op::forward, P, s), b = units(lists[s], Op::backward, P, s);
          std::sort(f.begin(), f.end());
          std::sort(b.begin(), b.end());
          std::vector<std::pair<int, int>> all;
          for (int c = 0; c < V; ++c)
            for (int mb = 0; mb < M; ++mb) all.push_back({c * P + s, mb});
          REQUIRE(f == all);
          REQUIRE(b == all);
          for (auto& a : lists[s])
            if (a.op == Op::forward) {
              auto at = [&](Op op) {
                return std::find(lists[s].begin(), lists[s].end(), Action{op, a.mb, a.chunk}) - lists[s].begin();
              };
              REQUIRE(at(Op::forward) < at(Op::backward));
            }
          // What rank s sends from virtual stage v, rank s+1 (rank 0 after the last) receives into
          // v+1, in the same order; gradients the other way.
          const int to = (s + 1) % P;
          auto shifted = [&](std::vector<std::pair<int, int>> u, int by) {
            for (auto& x : u) x.first += by;
            return u;
          };
          REQUIRE(shifted(units(lists[s], Op::send_act, P, s), 1) == units(lists[to], Op::recv_act, P, to));
          REQUIRE(units(lists[to], Op::send_grad, P, to) == shifted(units(lists[s], Op::recv_grad, P, s), 1));
        }
        CHECK(units(lists[0], Op::recv_act, P, 0).size() ==
              static_cast<size_t>((V - 1) * M));  // chunk 0 of rank 0 reads tokens
        CHECK(units(lists[P - 1], Op::send_act, P, P - 1).size() == static_cast<size_t>((V - 1) * M));
        const std::vector<double> f(P * V, 1.0), b(P * V, 2.0);
        const SimResult sim = simulate(lists, f, b);  // throws on a deadlock
        // With every chunk-forward 1 and chunk-backward 2 the idle time is (P-1)(F+B) of chunks:
        // 1F1B's (P-1)(F+B) of whole stages divided by V.
        for (int s = 0; s < P; ++s) CHECK(sim.makespan - sim.busy[s] == Approx(3.0 * (P - 1)));
        CHECK(sim.mean_bubble() == Approx(schedule_bubble("interleaved", P, M, V)));
        CHECK(schedule_bubble("interleaved", P, M, V) < schedule_bubble("1f1b", P, M));
      }
}

TEST_CASE("interleaved: stage s holds 2(P-1-s) + (V-1)P + 1 chunk-micro-batches, all of them when M = P",
          "[schedule]") {
  for (int V = 2; V <= 4; ++V)
    for (int P = 2; P <= 6; ++P)
      for (int M = P; M <= 3 * P; M += P)
        for (int s = 0; s < P; ++s) {
          INFO("P=" << P << " M=" << M << " V=" << V << " stage " << s);
          const int want = M == P ? M * V : std::min(M * V, 2 * (P - 1 - s) + (V - 1) * P + 1);
          CHECK(max_in_flight(make_schedule("interleaved", s, P, M, V)) == want);
        }
  // In micro-batches of the whole stage (V chunks each): P + (P-1)/V on stage 0 against 1F1B's P.
  CHECK(max_in_flight(make_schedule("interleaved", 0, 4, 8, 2)) / 2.0 == Approx(4 + 3.0 / 2));
}

TEST_CASE("interleaved: P=2, M=4, V=2 chart, chunk 1 marked .1", "[schedule]") {
  // Stage 1 warms up with chunk 0 of the first group, then alternates; stage 0 warms up with two
  // more chunk-forwards. 18 slots against 1F1B's 2 x (4 + 2 - 1) x 2 = 20 for the same work.
  const std::vector<double> one(4, 1.0);
  const std::string want =
      "t:        0    1    2    3    4    5    6    7    8    9    10   11   12   13   14   15   16   17\n"
      "Stage 0:  F0   F1   F0.1 F1.1 F2   B0.1 F3   B1.1 F2.1 B0   F3.1 B1   ·    B2.1 ·    B3.1 B2   B3\n"
      "Stage 1:  ·    F0   F1   F0.1 B0.1 F1.1 B1.1 F2   B0   F3   B1   F2.1 B2.1 F3.1 B3.1 B2   B3   ·\n";
  CHECK(render_chart(simulate(interleaved(2, 4, 2), one, one)) == want);
  CHECK(to_string({Op::forward, 3, 1}) == "F3.1");
  CHECK(to_string({Op::recv_grad, 0, 2}) == "recvG0.2");
  CHECK_THROWS_AS(make_schedule("interleaved", 0, 2, 3, 2), std::invalid_argument);  // M not a multiple of P
  CHECK(layout_problem(schedule_named("1f1b"), {2, 4, 2, 8}).key == "parallel.virtual_stages");  // one chunk only
}

TEST_CASE("simulator: a sender waits for the receiver's ring buffers, as the executor does", "[schedule]") {
  // Stage 1 takes 10 per forward: stage 0's k-th send needs stage 1 to have taken message
  // k - kMessageRing - 1, so F5 starts when stage 1 took message 1 (t = 11), not at t = 5.
  const SimResult r = simulate(all_stages(2, 6), {1.0, 10.0}, {1.0, 1.0});
  REQUIRE(kMessageRing == 2);
  CHECK(r.spans[0][4].start == 4);
  CHECK(r.spans[0][5].start == 11);
}

TEST_CASE("forward_only: every schedule's forwards alone run each micro-batch once per chunk, deadlock-free",
          "[schedule]") {
  for (const std::string name : {"gpipe", "1f1b", "zb-h1", "interleaved"})
    for (int P = 2; P <= 5; ++P)
      for (int M = P; M <= 3 * P; M += P) {
        const int V = name == "interleaved" ? 2 : 1;
        INFO(name << " P=" << P << " M=" << M);
        std::vector<ActionList> lists;
        for (int s = 0; s < P; ++s) lists.push_back(forward_only(make_schedule(name, s, P, M, V)));
        for (int s = 0; s < P; ++s) {
          CHECK(units(lists[s], Op::forward, P, s).size() == static_cast<size_t>(M * V));
          for (const Action& a : lists[s]) CHECK((a.op == Op::forward || a.op == Op::recv_act || a.op == Op::send_act));
        }
        const std::vector<double> one(P * V, 1.0);
        CHECK(simulate(lists, one, one).makespan == Approx(V * M + P - 1));  // the forward pipeline, no gaps
      }
}

TEST_CASE("held activation bytes: each buffer pool keeps its own peak, split-backward gradients a pool of their own",
          "[schedule]") {
  const Op F = Op::forward, B = Op::backward, Bi = Op::backward_input, W = Op::backward_weight;
  // Chunk 0 peaks at two micro-batches early, chunk 1 at two later: never four at once.
  const ActionList list = {{F, 0, 0}, {F, 1, 0}, {B, 0, 0}, {B, 1, 0}, {F, 0, 1}, {F, 1, 1}, {B, 0, 1}, {B, 1, 1}};
  const std::vector<size_t> stash = {100, 100}, none = {0, 0};
  CHECK(peak_activation_bytes(list, stash, none) == 200);
  CHECK(held_activation_bytes(list, stash, none, {0, 0}) == 200);  // one pool: its slots serve both chunks
  CHECK(held_activation_bytes(list, stash, none, {0, 1}) == 400);  // two pools: each keeps its two slots
  // Chunks of different sizes in their own pools: each slot keeps only its own chunk's size.
  CHECK(held_activation_bytes(list, {100, 30}, none, {0, 1}) == 2 * 100 + 2 * 30);
  // B..W gradients: two pending at once at most, while three micro-batches' activations are live.
  const ActionList split = {{F, 0, 0}, {F, 1, 0},  {F, 2, 0}, {Bi, 0, 0}, {Bi, 1, 0},
                            {W, 0, 0}, {Bi, 2, 0}, {W, 1, 0}, {W, 2, 0}};
  CHECK(peak_activation_bytes(split, {100}, {10}) == 320);
  CHECK(held_activation_bytes(split, {100}, {10}, {0}) == 3 * 100 + 2 * 10);
}
