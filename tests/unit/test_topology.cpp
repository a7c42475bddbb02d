// Rank order (parallel.order) and the node map: which stage and replica each world rank runs, and
// which pipeline links and data groups cross nodes when nodes take consecutive ranks.
#include <catch2/catch.hpp>

#include <set>

#include "pipetrain/dist/topology.hpp"

using namespace pipetrain;

TEST_CASE("rank order pp keeps a pipeline's stages consecutive, dp a stage's replicas", "[topology]") {
  for (RankOrder order : {RankOrder::pp, RankOrder::dp})
    for (int P : {1, 2, 3, 4})
      for (int D : {1, 2, 3}) {
        INFO(name_of(order) << " P=" << P << " D=" << D);
        std::set<std::pair<int, int>> seen;
        for (int r = 0; r < P * D; ++r) {
          const Topology t = Topology::of(r, P, D, order);
          CHECK(t.rank_of(t.stage, t.dp_rank) == r);  // a bijection
          seen.insert({t.stage, t.dp_rank});
          if (order == RankOrder::pp) CHECK(t.stage == r % P);
          else CHECK(t.dp_rank == r % D);
        }
        CHECK(seen.size() == static_cast<size_t>(P * D));
      }
}

TEST_CASE("node map: 2 stages x 2 replicas on 2 nodes of 2 ranks", "[topology]") {
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  // pp order: each node runs one whole pipeline; the all-reduce of every stage crosses nodes.
  CHECK(node_map(hosts, Topology::of(0, 2, 2, RankOrder::pp)) ==
        "node map (parallel.order = pp):\n  a: s0/d0 s1/d0\n  b: s0/d1 s1/d1\n"
        "  pipeline links crossing nodes: 0 of 2 | data groups spanning nodes: 2 of 2\n");
  // dp order: each node runs one stage's replicas; every pipeline link crosses nodes.
  CHECK(node_map(hosts, Topology::of(0, 2, 2, RankOrder::dp)) ==
        "node map (parallel.order = dp):\n  a: s0/d0 s0/d1\n  b: s1/d0 s1/d1\n"
        "  pipeline links crossing nodes: 2 of 2 | data groups spanning nodes: 0 of 2\n");
}
