// Which blocks each stage owns: uniform, balanced (cost model incl. embedding and head), explicit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <sstream>

#include "pipetrain/model/partition.hpp"

using namespace pipetrain;

namespace {

RunSpec spec_with(int n_layer, int pp, const std::string& partition) {
  RunSpec s;
  s.model.n_layer = n_layer;
  s.parallel.pp = pp;
  s.parallel.partition = *choice_named<Partition>(partition);
  return s;
}

// The most expensive stage, each stage's cost times its rate (none: all 1).
double max_cost(const RunSpec& s, const std::vector<int>& blocks, const std::vector<double>& rate = {}) {
  auto c = stage_costs(s, blocks);
  for (size_t i = 0; i < c.size() && !rate.empty(); ++i) c[i] *= rate[i];
  return *std::max_element(c.begin(), c.end());
}

// Every contiguous split of L blocks over P stages (each >= 1), the smallest maximum stage cost.
double brute_force_best(const RunSpec& s, const std::vector<double>& rate = {}) {
  const int L = s.model.n_layer, P = s.parallel.pp;
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> blocks;
  std::function<void(int)> rec = [&](int left) {
    const int stages_left = P - static_cast<int>(blocks.size());
    if (stages_left == 1) {
      blocks.push_back(left);
      best = std::min(best, max_cost(s, blocks, rate));
      blocks.pop_back();
      return;
    }
    for (int b = 1; b <= left - (stages_left - 1); ++b) {
      blocks.push_back(b);
      rec(left - b);
      blocks.pop_back();
    }
  };
  rec(L);
  return best;
}

void check_valid(const std::vector<int>& b, int L, int P) {
  REQUIRE(static_cast<int>(b.size()) == P);
  for (int x : b) CHECK(x >= 1);
  CHECK(std::accumulate(b.begin(), b.end(), 0) == L);
}

}  // namespace

TEST_CASE("uniform partition splits the remainder over the first stages", "[partition]") {
  CHECK(partition_blocks(spec_with(7, 3, "uniform")) == std::vector<int>{3, 2, 2});
  CHECK(partition_blocks(spec_with(8, 4, "uniform")) == std::vector<int>{2, 2, 2, 2});
  CHECK(partition_blocks(spec_with(5, 1, "uniform")) == std::vector<int>{5});
  CHECK(partition_blocks(spec_with(4, 4, "uniform")) == std::vector<int>{1, 1, 1, 1});
  CHECK(partition_blocks(spec_with(10, 4, "uniform")) == std::vector<int>{3, 3, 2, 2});
}

TEST_CASE("every partition gives each stage >= 1 block and sums to n_layer", "[partition]") {
  for (const char* kind : {"uniform", "balanced"})
    for (int L = 1; L <= 24; ++L)
      for (int P = 1; P <= L; ++P) {
        INFO(kind << " L=" << L << " P=" << P);
        auto b = partition_blocks(spec_with(L, P, kind));
        check_valid(b, L, P);
        if (std::string(kind) == "uniform") {
          auto [lo, hi] = std::minmax_element(b.begin(), b.end());
          CHECK(*hi - *lo <= 1);
        }
      }
}

TEST_CASE("stage_costs adds the embedding to the first and the head to the last stage", "[partition]") {
  RunSpec s = spec_with(6, 3, "uniform");
  const CostModel m = CostModel::of(s);
  CHECK(m.block > 0);
  CHECK(m.embed > 0);
  CHECK(m.head > 0);
  auto c = stage_costs(s, {1, 2, 3});
  REQUIRE(c.size() == 3);
  CHECK(c[0] == Approx(1 * m.block + m.embed));
  CHECK(c[1] == Approx(2 * m.block));
  CHECK(c[2] == Approx(3 * m.block + m.head));
  auto one = stage_costs(spec_with(4, 1, "uniform"), {4});
  CHECK(one[0] == Approx(4 * m.block + m.embed + m.head));
}

TEST_CASE("balanced partition minimises the most expensive stage (brute force)", "[partition]") {
  struct Shape {
    int d_model, seq_len, vocab;
  };
  for (Shape sh :
       {Shape{64, 32, 256}, Shape{16, 32, 4096}, Shape{64, 32, 2048}, Shape{128, 512, 256}, Shape{32, 8, 50000}})
    for (int L = 1; L <= 10; ++L)
      for (int P = 1; P <= std::min(L, 5); ++P) {
        RunSpec s = spec_with(L, P, "balanced");
        s.model.d_model = sh.d_model;
        s.model.seq_len = sh.seq_len;
        s.model.vocab = sh.vocab;
        INFO("d=" << sh.d_model << " T=" << sh.seq_len << " V=" << sh.vocab << " L=" << L << " P=" << P);
        auto b = partition_blocks(s);
        check_valid(b, L, P);
        const double got = max_cost(s, b), best = brute_force_best(s);
        CHECK(got == Approx(best).epsilon(1e-9));
        RunSpec u = s;
        u.parallel.partition = Partition::uniform;
        CHECK(got <= max_cost(u, partition_blocks(u)) * (1 + 1e-12));
      }
}

TEST_CASE("balanced_blocks with measured rates minimises the slowest stage's time (brute force)", "[partition]") {
  // Rates as a slowed rank gives them: one stage 1.5 to 4 times slower than the others.
  for (int L = 2; L <= 12; ++L)
    for (int P = 2; P <= std::min(L, 4); ++P)
      for (int slow = 0; slow < P; ++slow)
        for (double factor : {1.5, 2.0, 4.0}) {
          RunSpec s = spec_with(L, P, "uniform");
          std::vector<double> rate(P, 1.0);
          rate[slow] = factor;
          INFO("L=" << L << " P=" << P << " slow stage " << slow << " x" << factor);
          const std::vector<int> b = balanced_blocks(s, rate);
          check_valid(b, L, P);
          CHECK(max_cost(s, b, rate) == Approx(brute_force_best(s, rate)).epsilon(1e-9));
          // The slowed stage never gets more blocks than it has where all run alike.
          CHECK(b[slow] <= balanced_blocks(s)[slow]);
        }
  // tiny.toml's shape, stage 1 three times slower: it keeps one block.
  CHECK(balanced_blocks(spec_with(4, 2, "uniform"), {1.0, 3.0}) == std::vector<int>{3, 1});
}

TEST_CASE("balanced gives the last stage fewer blocks when the head is expensive", "[partition]") {
  RunSpec s = spec_with(12, 4, "balanced");
  s.model.d_model = 64;
  s.model.vocab = 2048;  // the LM head costs about 2.6 blocks
  const auto bal = partition_blocks(s);
  RunSpec u = s;
  u.parallel.partition = Partition::uniform;
  const auto uni = partition_blocks(u);
  REQUIRE(uni == std::vector<int>{3, 3, 3, 3});
  CHECK(bal.back() < uni.back());
  CHECK(max_cost(s, bal) < max_cost(u, uni));

  RunSpec huge = spec_with(8, 2, "balanced");
  huge.model.d_model = 16;
  huge.model.vocab = 50000;  // the head alone outweighs all blocks
  CHECK(partition_blocks(huge) == std::vector<int>{7, 1});
}

TEST_CASE("explicit partition is returned as given", "[partition]") {
  RunSpec s = spec_with(6, 3, "explicit");
  s.parallel.blocks_per_stage = {3, 1, 2};
  CHECK(partition_blocks(s) == std::vector<int>{3, 1, 2});

  RunSpec t = load_spec("", {"model.n_layer=7", "parallel.pp=3", "parallel.partition=[1,5,1]"}, 3);
  CHECK(partition_blocks(t) == std::vector<int>{1, 5, 1});
}

TEST_CASE("describe_partition prints one line per stage with the block ranges", "[partition]") {
  RunSpec s = spec_with(7, 3, "uniform");
  std::string text = describe_partition(s, partition_blocks(s));
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 3);
  CHECK_THAT(lines[0], Catch::Matchers::Contains("blocks 0-2") && Catch::Matchers::Contains("+embeddings"));
  CHECK_THAT(lines[1], Catch::Matchers::Contains("blocks 3-4"));
  CHECK_THAT(lines[2], Catch::Matchers::Contains("blocks 5-6") && Catch::Matchers::Contains("+head"));
}
