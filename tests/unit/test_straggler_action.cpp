// log.straggler_action (train/straggler_action.hpp): what a persistent straggler leads to, decided
// on the detector's windows.
#include <catch2/catch.hpp>

#include <algorithm>

#include "pipetrain/model/partition.hpp"
#include "pipetrain/train/straggler_action.hpp"

using namespace pipetrain;

namespace {

// Per rank its compute per step over one window of 10 steps.
std::vector<WindowFigures> window(const std::vector<double>& computes) {
  std::vector<WindowFigures> w(computes.size());
  for (size_t r = 0; r < computes.size(); ++r) {
    w[r].steps = 10;
    w[r].own_s = computes[r];
  }
  return w;
}

// tiny.toml's model on pp 2 x dp 1, one rank on each of nodes n1 and n2.
RunSpec two_stages(StragglerAction action) {
  RunSpec s;
  s.model.n_layer = 4;
  s.parallel.pp = 2;
  s.parallel.dp = 1;
  s.log.straggler_action = action;
  s.log.straggler_act_after = 3;
  return s;
}
StragglerDetector two_nodes() { return StragglerDetector({{0, 0, "n1"}, {1, 0, "n2"}}, {0.5, 0.5}, 1.25); }

// Feeds `windows` windows in which rank 1 (node n2) computes `slow` times as long as rank 0, and
// returns the policy's moves and the lines it said.
std::vector<StragglerMove> feed(StragglerDetector& d, StragglerPolicy& policy, int windows, double slow,
                                std::vector<std::string>& said) {
  std::vector<StragglerMove> moves;
  for (int w = 1; w <= windows; ++w) {
    d.observe(window({1.0, slow}), 10 * w);
    moves.push_back(policy.after_window(d, said));
  }
  return moves;
}

}  // namespace

TEST_CASE("straggler action exclude: a node slow in act_after windows in a row, where the job can spare it",
          "[straggler_action]") {
  const RunSpec spec = two_stages(StragglerAction::exclude);
  {
    StragglerDetector d = two_nodes();
    StragglerPolicy policy(spec, {2, 2}, 1);
    std::vector<std::string> said;
    const std::vector<StragglerMove> moves = feed(d, policy, 3, 3.0, said);
    CHECK(moves[0].kind == StragglerAction::log);
    CHECK(moves[1].kind == StragglerAction::log);  // flagged (two windows), not yet acted on
    REQUIRE(moves[2].kind == StragglerAction::exclude);
    CHECK(moves[2].nodes == std::vector<std::string>{"n2"});
    CHECK(moves[2].why.find("node n2 slow in 3 windows in a row") != std::string::npos);
  }
  SECTION("a window within the ratio starts the count again") {
    StragglerDetector d = two_nodes();
    StragglerPolicy policy(spec, {2, 2}, 1);
    std::vector<std::string> said;
    feed(d, policy, 2, 3.0, said);
    d.observe(window({1.0, 1.0}), 30);
    CHECK(policy.after_window(d, said).kind == StragglerAction::log);
    CHECK(feed(d, policy, 2, 3.0, said).back().kind == StragglerAction::log);
    CHECK(feed(d, policy, 1, 3.0, said).back().kind == StragglerAction::exclude);
  }
  SECTION("without a node to spare, or not told, it says why once and does nothing") {
    for (int spare : {-1, 0}) {
      StragglerDetector d = two_nodes();
      StragglerPolicy policy(spec, {2, 2}, spare);
      std::vector<std::string> said;
      for (const StragglerMove& m : feed(d, policy, 6, 3.0, said)) CHECK(m.kind == StragglerAction::log);
      REQUIRE(said.size() == 1);
      CHECK(said[0].find("node n2 slow in 3 windows in a row, not excluded") != std::string::npos);
      CHECK(said[0].find(spare < 0 ? "PIPETRAIN_SPARE_NODES" : "no node to spare") != std::string::npos);
    }
  }
  SECTION("a slow node among several is named; with one to spare only the slowest goes") {
    StragglerDetector d({{0, 0, "n1"}, {1, 0, "n2"}, {0, 1, "n3"}, {1, 1, "n4"}}, {0.5, 0.5}, 1.25);
    StragglerPolicy policy(spec, {2, 2}, 1);
    std::vector<std::string> said;
    StragglerMove last;
    for (int w = 1; w <= 3; ++w) {
      d.observe(window({1.0, 1.0, 2.0, 3.0}), 10 * w);
      last = policy.after_window(d, said);
    }
    REQUIRE(last.kind == StragglerAction::exclude);
    CHECK(last.nodes == std::vector<std::string>{"n4"});
  }
}

TEST_CASE("straggler action rebalance: a slow rank's stage gets fewer blocks where that gains enough",
          "[straggler_action]") {
  const RunSpec spec = two_stages(StragglerAction::rebalance);
  StragglerDetector d = two_nodes();
  StragglerPolicy policy(spec, {2, 2}, -1);
  std::vector<std::string> said;
  const std::vector<StragglerMove> moves = feed(d, policy, 3, 3.0, said);
  CHECK(moves[1].kind == StragglerAction::log);
  REQUIRE(moves[2].kind == StragglerAction::rebalance);
  CHECK(moves[2].blocks == std::vector<int>{3, 1});
  CHECK(moves[2].why.find("partition [2, 2] -> [3, 1]") != std::string::npos);

  SECTION("the gain is the slowest stage's time on the old partition over the new") {
    // Stage costs of [2, 2] and [3, 1] from the cost model, each stage at its measured rate.
    const std::vector<double> old_c = stage_costs(spec, {2, 2}), new_c = stage_costs(spec, {3, 1});
    const double old_t = std::max(old_c[0] * 1.0, old_c[1] * 3.0), new_t = std::max(new_c[0] * 1.0, new_c[1] * 3.0);
    const StragglerPolicy::Rebalance r = policy.rebalanced(d.places(), d.per_work_s());
    CHECK(r.gain == Approx(old_t / new_t));
    CHECK(d.per_work_s()[1] / d.per_work_s()[0] == Approx(3.0));
  }
  SECTION("on the partition the measured speeds call for, it stays, saying so once") {
    StragglerDetector again = two_nodes();
    StragglerPolicy balanced(spec, {3, 1}, -1);
    std::vector<std::string> lines;
    for (const StragglerMove& m : feed(again, balanced, 5, 3.0, lines)) CHECK(m.kind == StragglerAction::log);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("the partition [3, 1] is kept") != std::string::npos);
  }
}

TEST_CASE("straggler action log does nothing", "[straggler_action]") {
  StragglerDetector d = two_nodes();
  StragglerPolicy policy(two_stages(StragglerAction::log), {2, 2}, 4);
  std::vector<std::string> said;
  for (const StragglerMove& m : feed(d, policy, 5, 3.0, said)) CHECK(m.kind == StragglerAction::log);
  CHECK(said.empty());
}
