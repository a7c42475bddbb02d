// Straggler detection (observe/stragglers.hpp): which rank, node or link is persistently slower
// than its peers, reported once when it becomes one and once when it is no longer.
#include <catch2/catch.hpp>

#include "pipetrain/observe/stragglers.hpp"

using namespace pipetrain;

namespace {

// A window of `computes` (per rank, seconds per step), no links.
std::vector<WindowFigures> window(const std::vector<double>& computes, double steps = 10) {
  std::vector<WindowFigures> w(computes.size());
  for (size_t r = 0; r < computes.size(); ++r) {
    w[r].steps = steps;
    w[r].own_s = computes[r];
  }
  return w;
}

// pp 2 x dp 2 on one node, ranks in pipeline order: (stage, replica) = (0,0) (1,0) (0,1) (1,1).
StragglerDetector two_by_two(std::vector<double> share = {0.5, 0.5}) {
  return StragglerDetector({{0, 0, "a"}, {1, 0, "a"}, {0, 1, "a"}, {1, 1, "a"}}, std::move(share), 1.25);
}

}  // namespace

TEST_CASE("stragglers: a rank slower than its replica in two windows in a row is reported once", "[stragglers]") {
  StragglerDetector d = two_by_two();
  CHECK(d.observe(window({1.0, 1.0, 1.0, 1.0}), 10).empty());
  CHECK(d.observe(window({1.0, 1.0, 1.5, 1.0}), 20).empty());  // one window over: not yet
  const std::vector<std::string> lines = d.observe(window({1.0, 1.0, 1.5, 1.0}), 30);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("straggler: rank 2 (stage 0, replica 1, a)") == 0);
  CHECK(lines[0].find("1.50x") != std::string::npos);
  CHECK(lines[0].find("steps 21-30") != std::string::npos);
  REQUIRE(d.flagged().size() == 1);
  CHECK(d.flagged()[0].name == "rank 2 (stage 0, replica 1, a)");
  CHECK(d.rank_ratio()[2] == Approx(1.5));
  CHECK(d.observe(window({1.0, 1.0, 1.5, 1.0}), 40).empty());  // still one: not said again
  CHECK(d.observe(window({1.0, 1.0, 1.0, 1.0}), 50).empty());  // one window within: not yet cleared
  const std::vector<std::string> cleared = d.observe(window({1.0, 1.0, 1.0, 1.0}), 60);
  REQUIRE(cleared.size() == 1);
  CHECK(cleared[0].find("straggler cleared: rank 2") == 0);
  CHECK(d.flagged().empty());
}

TEST_CASE("stragglers: alternating noisy windows never raise one", "[stragglers]") {
  StragglerDetector d = two_by_two();
  for (int w = 1; w <= 20; ++w) CHECK(d.observe(window({1.0, 1.0, w % 2 ? 1.4 : 1.0, 1.0}), 10 * w).empty());
  CHECK(d.flagged().empty());
}

TEST_CASE("stragglers: stages are compared through their expected share of the work", "[stragglers]") {
  // pp 2 x dp 1: stage 1 holds the head and does 60% of the work; 1.5x as long is what it should take.
  StragglerDetector d({{0, 0, "a"}, {1, 0, "a"}}, {0.4, 0.6}, 1.25);
  for (int w = 1; w <= 3; ++w) CHECK(d.observe(window({1.0, 1.5}), 10 * w).empty());
  CHECK(d.rank_ratio()[1] == Approx(1.0));
  // 1.4x through the cost model is within its error (flagged above 1.25 x kModelError = 1.5625).
  for (int w = 4; w <= 6; ++w) CHECK(d.observe(window({1.4, 1.5}), 10 * w).empty());
  CHECK(d.window_json()["window"]["threshold"] == nlohmann::json({1.5625, 1.5625}));
  // Now stage 0 takes twice what its share says.
  d.observe(window({2.0, 1.5}), 70);
  const std::vector<std::string> lines = d.observe(window({2.0, 1.5}), 80);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("rank 0 (stage 0, replica 0, a) computes 2.00x") != std::string::npos);
}

TEST_CASE("stragglers: a slow node is named by the median of its ranks", "[stragglers]") {
  // pp 2 x dp 2, replica 1 on node "b" (both its stages), which computes twice as long: besides
  // its two ranks (each against its replica on a), the node itself is named, and a is not.
  StragglerDetector d({{0, 0, "a"}, {1, 0, "a"}, {0, 1, "b"}, {1, 1, "b"}}, {0.5, 0.5}, 1.25);
  d.observe(window({1.0, 1.0, 2.0, 2.0}), 10);
  const std::vector<std::string> lines = d.observe(window({1.0, 1.0, 2.0, 2.0}), 20);
  bool node_named = false;
  for (const std::string& l : lines) node_named = node_named || l.find("straggler: node b computes 2.00x") == 0;
  CHECK(node_named);
  for (const std::string& l : lines) CHECK(l.find("node a") == std::string::npos);
}

TEST_CASE("stragglers: a slow link is compared with the links of its kind, above the polling floor", "[stragglers]") {
  // pp 2 x dp 1 across two nodes: the gradient link from node b is slow, the activation link not.
  StragglerDetector d({{0, 0, "a"}, {1, 0, "b"}}, {0.5, 0.5}, 1.25);
  auto links = [](double into_0, double into_1) {
    std::vector<WindowFigures> w = window({1.0, 1.0});
    w[0].link_from[0] = 1;  // rank 0 receives gradients from stage 1
    w[0].link_s[0] = into_0;
    w[1].link_from[0] = 0;
    w[1].link_s[0] = into_1;
    return w;
  };
  // Both tiny: far apart in ratio but within what polling adds to any message.
  for (int w = 1; w <= 3; ++w) CHECK(d.observe(links(400e-6, 50e-6), 10 * w).empty());
  d.observe(links(0.020, 0.001), 40);
  const std::vector<std::string> lines = d.observe(links(0.020, 0.001), 50);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("straggler: link rank 1 -> rank 0 (b -> a) delivers a message in 20.00 ms, 20.00x") == 0);
  // A link from a rank that is slow itself is late because of that rank: only the rank is named.
  StragglerDetector capped({{0, 0, "a"}, {1, 0, "b"}}, {0.5, 0.5}, 1.25);
  std::vector<WindowFigures> slow_sender = links(0.020, 0.001);
  slow_sender[1].own_s = 3.0;
  capped.observe(slow_sender, 10);
  for (const std::string& l : capped.observe(slow_sender, 20)) CHECK(l.find("link") == std::string::npos);
  REQUIRE(capped.flagged().size() == 2);  // rank 1 and node b
  // Where ranks outnumber cores, links are measured but not judged.
  StragglerDetector crowded({{0, 0, "a"}, {1, 0, "b"}}, {0.5, 0.5}, 1.25, /*judge_links=*/false);
  for (int w = 1; w <= 3; ++w) CHECK(crowded.observe(links(0.020, 0.001), 10 * w).empty());
  CHECK_FALSE(crowded.window_json()["window"]["links"].empty());
  // Nobody waits on it any more (no figure): cleared after two such windows.
  d.observe(window({1.0, 1.0}), 60);
  const std::vector<std::string> quiet = d.observe(window({1.0, 1.0}), 70);
  REQUIRE(quiet.size() == 1);
  CHECK(quiet[0].find("straggler cleared: link rank 1 -> rank 0") == 0);
}

TEST_CASE("stragglers: a window lasts its steps and a second at least, with medians of what each step measured",
          "[stragglers]") {
  StragglerWindow w(3, 100.0);  // opened at t = 100 s
  w.add_step(1.0, 0.1, {{1, {0.002, 0.004}}});
  w.add_step(9.0, 0.3, {});
  CHECK_FALSE(w.long_enough(200.0));  // 2 of 3 steps
  w.add_step(2.0, 0.2, {{1, {0.003}}, {3, {0.5}}});
  CHECK_FALSE(w.long_enough(100.5));  // 3 steps in half a second: a hiccup could fill it
  CHECK(w.long_enough(101.0));
  CHECK_FALSE(w.closing());
  w.agree_to_close();
  CHECK(w.closing());
  const WindowFigures f = w.close(101.2);
  CHECK(f.steps == 3);
  CHECK(f.own_s == 2.0);  // the median: the step with 9 s does not move it
  CHECK(f.wait_s == Approx(0.2));
  CHECK(f.link_from[0] == 1);
  CHECK(f.link_s[0] == Approx(0.003));
  CHECK(f.link_from[1] == 3);
  CHECK(f.link_s[1] == Approx(0.5));
  double packed[WindowFigures::kFields];
  f.to(packed);
  CHECK(WindowFigures::from(packed).link_s[1] == Approx(0.5));
  CHECK_FALSE(w.closing());  // a fresh window, opened at 101.2 s
  w.add_step(1.0, 0.1, {});
  w.add_step(1.0, 0.1, {});
  w.add_step(1.0, 0.1, {});
  CHECK_FALSE(w.long_enough(102.0));
  CHECK(w.long_enough(102.2));
}

TEST_CASE("stragglers: the metrics keys carry the window and those flagged", "[stragglers]") {
  StragglerDetector d = two_by_two();
  d.observe(window({1.0, 1.0, 1.5, 1.0}), 10);
  d.observe(window({1.0, 1.0, 1.5, 1.0}), 20);
  const nlohmann::json keys = d.window_json();
  REQUIRE(keys.size() == 2);
  CHECK(keys["window"]["first_step"] == 11);
  REQUIRE(keys["stragglers"].size() == 1);
  CHECK(keys["stragglers"][0]["name"] == "rank 2 (stage 0, replica 1, a)");
}
