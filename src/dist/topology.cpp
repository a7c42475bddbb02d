#include "pipetrain/dist/topology.hpp"

#include <map>
#include <set>

namespace pipetrain {

std::vector<std::string> nodes_filled_in_order(int ranks, int per_node) {
  std::vector<std::string> hosts;
  for (int r = 0; r < ranks; ++r) hosts.push_back("node" + std::to_string(r / per_node));
  return hosts;
}

std::string node_map(const std::vector<std::string>& host_of_rank, const Topology& layout) {
  const int P = layout.pp, D = layout.dp, TP = layout.tp;
  std::map<std::string, std::string> on_node;  // node -> "s0/d0 s1/d0 ..." (with tp: "s0/d0/t0 ...")
  std::vector<std::string> order_seen;
  for (int r = 0; r < static_cast<int>(host_of_rank.size()); ++r) {
    const Topology t = Topology::of(r, P, D, layout.order, false, TP);
    const std::string& h = host_of_rank[r];
    if (!on_node.count(h)) order_seen.push_back(h);
    on_node[h] += (on_node[h].empty() ? "" : " ") + std::string("s") + std::to_string(t.stage) + "/d" +
                  std::to_string(t.dp_rank) + (TP > 1 ? "/t" + std::to_string(t.tp_rank) : "");
  }
  int links = 0, crossing = 0, spread = 0, tensor_spread = 0;
  for (int k = 0; k < TP; ++k)
    for (int d = 0; d < D; ++d)
      for (int s = 0; s + 1 < P; ++s, ++links)
        crossing += host_of_rank[layout.rank_of(s, d, k)] != host_of_rank[layout.rank_of(s + 1, d, k)];
  for (int s = 0; s < P; ++s)
    for (int k = 0; k < TP; ++k) {
      std::set<std::string> nodes;
      for (int d = 0; d < D; ++d) nodes.insert(host_of_rank[layout.rank_of(s, d, k)]);
      spread += nodes.size() > 1;
    }
  for (int s = 0; s < P; ++s)
    for (int d = 0; d < D; ++d) {
      std::set<std::string> nodes;
      for (int k = 0; k < TP; ++k) nodes.insert(host_of_rank[layout.rank_of(s, d, k)]);
      tensor_spread += nodes.size() > 1;
    }
  std::string out = "node map (parallel.order = " + std::string(name_of(layout.order)) + "):";
  for (const auto& h : order_seen) out += "\n  " + h + ": " + on_node[h];
  out += "\n  pipeline links crossing nodes: " + std::to_string(crossing) + " of " + std::to_string(links) +
         " | data groups spanning nodes: " + std::to_string(spread) + " of " + std::to_string(P * TP);
  if (TP > 1)
    out += " | tensor groups spanning nodes: " + std::to_string(tensor_spread) + " of " + std::to_string(P * D);
  return out + "\n";
}

}  // namespace pipetrain
