// Chunk placements (loop and vee) and the V-shaped schedules (zb-v, dualpipev): every chunk's F
// and backward (fused, or B then W) once per micro-batch in order, every message received by the
// rank the placement names in the order it was sent on its link, no deadlock under the executor's
// ring model, and a step no longer than ZB-H1's with F = B = W (zb-v at 1F1B's peak memory).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <tuple>

#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/schedule/v_schedules.hpp"

using namespace pipetrain;

TEST_CASE("placement: a loop goes round the ranks, a vee down and back up", "[schedule]") {
  const ChunkPlacement loop{4, 2, Placement::loop}, vee{4, 2, Placement::vee};
  for (int s = 0; s < 4; ++s) {
    CHECK(loop.vstage(s, 0) == s);
    CHECK(loop.vstage(s, 1) == 4 + s);
    CHECK(vee.vstage(s, 0) == s);
    CHECK(vee.vstage(s, 1) == 7 - s);  // rank s holds s and 2P-1-s
    for (int c = 0; c < 2; ++c) {
      CHECK(loop.stage_of(loop.vstage(s, c)) == s);
      CHECK(vee.stage_of(vee.vstage(s, c)) == s);
      CHECK(vee.chunk_of(vee.vstage(s, c)) == c);
    }
  }
  CHECK(loop.head_stage() == 3);
  CHECK(vee.head_stage() == 0);  // both ends of the model on the first rank
  // Links: a loop's first rank sends activations to and takes gradients from rank 1 only; the
  // vee's last rank also talks to itself at the turn.
  CHECK(message_links({4, 1, Placement::loop}, 0).size() == 2);
  CHECK(message_links({4, 1, Placement::loop}, 1).size() == 4);
  CHECK(message_links(vee, 3).count({false, false, 3}) == 1);
  CHECK(message_links(vee, 3).count({false, true, 3}) == 1);
  CHECK(message_links({1, 1, Placement::loop}, 0).empty());
}

namespace {

std::vector<ActionList> v_lists(const std::string& name, int P, int M) {
  std::vector<ActionList> lists;
  for (int s = 0; s < P; ++s) lists.push_back(schedule_named(name).generate(s, {P, M, 2, 2 * P}));
  return lists;
}
std::vector<ActionList> zb_v(int P, int M) { return v_lists("zb-v", P, M); }

}  // namespace

TEST_CASE(
    "zb-v, dualpipev: each chunk's F and backward once per micro-batch in order, messages match on every "
    "link, and no deadlock",
    "[schedule]") {
  for (const std::string name : {"zb-v", "dualpipev"})
    for (int P = 1; P <= 8; ++P)
      for (int M = name == "zb-v" ? 1 : 2 * P; M <= 16; ++M) {
        INFO(name << " P=" << P << " M=" << M);
        const ChunkPlacement vee{P, 2, Placement::vee};
        const auto lists = v_lists(name, P, M);
        // (kind, from rank, to rank) -> the messages (virtual stage, mb) in the order sent / received
        std::map<std::tuple<int, int, int>, std::vector<std::pair<int, int>>> sent, received;
        for (int s = 0; s < P; ++s) {
          std::map<std::tuple<Op, int, int>, int> at;  // (op, chunk, mb) -> position
          for (int i = 0; i < static_cast<int>(lists[s].size()); ++i) {
            const Action& a = lists[s][i];
            REQUIRE(at.emplace(std::tuple{a.op, a.chunk, a.mb}, i).second);  // nothing twice
            const int v = vee.vstage(s, a.chunk);
            if (a.op == Op::send_act) sent[{0, s, vee.stage_of(v + 1)}].push_back({v, a.mb});
            if (a.op == Op::recv_act) received[{0, vee.stage_of(v - 1), s}].push_back({v - 1, a.mb});
            if (a.op == Op::send_grad) sent[{1, s, vee.stage_of(v - 1)}].push_back({v, a.mb});
            if (a.op == Op::recv_grad) received[{1, vee.stage_of(v + 1), s}].push_back({v + 1, a.mb});
          }
          for (int c = 0; c < 2; ++c)
            for (int mb = 0; mb < M; ++mb) {
              auto pos = [&](Op op) { return at.count({op, c, mb}) ? at[{op, c, mb}] : -1; };
              REQUIRE(pos(Op::forward) >= 0);
              if (pos(Op::backward) >= 0) {  // fused, or split into B then W; never both
                REQUIRE(pos(Op::forward) < pos(Op::backward));
                REQUIRE((pos(Op::backward_input) == -1 && pos(Op::backward_weight) == -1));
              } else {
                REQUIRE(pos(Op::forward) < pos(Op::backward_input));
                REQUIRE(pos(Op::backward_input) < pos(Op::backward_weight));
              }
            }
          if (name == "zb-v")
            CHECK(max_in_flight(lists[s]) <= 2 * P);  // 1F1B's peak: P whole micro-batches of two chunks
        }
        REQUIRE(sent == received);  // same messages, same order on every link: tags cannot cross
        const std::vector<double> one(2 * P, 1.0), two(2 * P, 2.0);
        CHECK_NOTHROW(simulate(lists, one, two, one, Placement::vee));
      }
}

TEST_CASE("zb-v: with F = B = W no longer than zb-h1, holding no more than 1f1b's peak", "[schedule]") {
  for (int P = 2; P <= 8; ++P)
    for (int M = P; M <= 16; M += P) {
      INFO("P=" << P << " M=" << M);
      std::vector<ActionList> h1, ofob;
      for (int s = 0; s < P; ++s) {
        h1.push_back(schedule_named("zb-h1").generate(s, {P, M, 1, P}));
        ofob.push_back(schedule_named("1f1b").generate(s, {P, M, 1, P}));
      }
      // A chunk is half a stage: per chunk F = B = W = 1, per stage 2.
      const std::vector<double> one(2 * P, 1.0), two(2 * P, 2.0), st2(P, 2.0), st4(P, 4.0);
      const double v = simulate(zb_v(P, M), one, two, one, Placement::vee).makespan;
      const double h = simulate(h1, st2, st4, st2).makespan;
      CHECK(v <= h);
      CHECK(v >= 6.0 * M);  // the work itself
      int peak_v = 0, peak_1f1b = 0;
      for (int s = 0; s < P; ++s) {
        peak_v = std::max(peak_v, max_in_flight(zb_v(P, M)[s]));
        peak_1f1b = std::max(peak_1f1b, max_in_flight(ofob[s]));
      }
      CHECK(peak_v <= 2 * peak_1f1b);  // in chunks: at most 1F1B's peak of whole micro-batches
    }
  // The figures the docs quote: P = 4, M = 8 takes 52 chunk slots for 48 of work.
  const std::vector<double> one(8, 1.0), two(8, 2.0);
  CHECK(simulate(zb_v(4, 8), one, two, one, Placement::vee).makespan == Approx(52));
  CHECK(schedule_named("zb-v").bubble({4, 8, 2, 8}) == Approx(1.0 - 48.0 / 52));
}

TEST_CASE("dualpipev: with F = B = W no longer than zb-h1, and its steady state pairs F with the other chunk's B",
          "[schedule]") {
  for (int P = 2; P <= 8; ++P)
    for (int M = 2 * P; M <= 16; M += 2) {
      INFO("P=" << P << " M=" << M);
      std::vector<ActionList> h1;
      for (int s = 0; s < P; ++s) h1.push_back(schedule_named("zb-h1").generate(s, {P, M, 1, P}));
      const std::vector<double> one(2 * P, 1.0), two(2 * P, 2.0), st2(P, 2.0), st4(P, 4.0);
      CHECK(simulate(v_lists("dualpipev", P, M), one, two, one, Placement::vee).makespan <=
            simulate(h1, st2, st4, st2).makespan);
    }
  // P = 2, M = 8: rank 0's computes after its warm-up alternate a chunk's forward with the other
  // chunk's fused backward.
  std::vector<Action> computes;
  const std::vector<ActionList> lists = v_lists("dualpipev", 2, 8);
  for (const Action& a : lists[0])
    if (a.op == Op::forward || a.op == Op::backward) computes.push_back(a);
  int pairs = 0;
  for (size_t i = 0; i + 1 < computes.size(); ++i)
    if (computes[i].op == Op::forward && computes[i + 1].op == Op::backward &&
        computes[i].chunk != computes[i + 1].chunk)
      ++pairs;
  CHECK(pairs >= 8);
  CHECK(schedule_named("dualpipev").bubble({4, 8, 2, 8}) < schedule_named("zb-v").bubble({4, 8, 2, 8}));
  CHECK(layout_problem(schedule_named("dualpipev"), {4, 6, 2, 8}).key == "parallel.micro_batches");
}

TEST_CASE("zb-v: the layout it needs", "[schedule]") {
  const ScheduleKind& zbv = schedule_named("zb-v");
  CHECK(layout_problem(zbv, {2, 4, 2, 4}).key.empty());
  CHECK(layout_problem(zbv, {2, 4, 3, 6}).key == "parallel.virtual_stages");
  CHECK(layout_problem(zbv, {2, 4, 1, 4}).key == "parallel.virtual_stages");
  CHECK(layout_problem(zbv, {4, 4, 2, 6}).key == "parallel.pp");  // 8 chunks, 6 blocks
  CHECK(layout_problem(schedule_named("1f1b"), {2, 4, 2, 4}).why.find("\"zb-v\"") != std::string::npos);
}
