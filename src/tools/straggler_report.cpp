#include "pipetrain/tools/straggler_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "pipetrain/util/stats.hpp"

using json = nlohmann::json;

namespace pipetrain {
namespace {

template <typename T>
std::string fmt(const char* format, T v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// Entry i of array `key` of a window, NaN when absent.
double at(const json& w, const char* key, size_t i) {
  return w.contains(key) && w[key].is_array() && i < w[key].size() && w[key][i].is_number() ? w[key][i].get<double>() : NAN;
}

}  // namespace

StragglerReport straggler_report(const std::vector<json>& lines, double ratio) {
  // The windows of the last rank count logged (a run resumed on another layout had other ranks).
  std::vector<const json*> windows;
  for (const json& l : lines)
    if (l.contains("window") && l["window"].is_object() && l["window"].contains("own_s")) windows.push_back(&l);
  if (windows.empty()) return {"", nullptr};
  const json& last = (*windows.back())["window"];
  const size_t R = last["own_s"].size();
  windows.erase(std::remove_if(windows.begin(), windows.end(), [&](const json* l) { return (*l)["window"]["own_s"].size() != R; }),
                windows.end());
  const std::vector<std::string> nodes = last.value("nodes", std::vector<std::string>{});

  // Per rank, per node and per link: medians over the windows. Time lost: per window, the largest
  // excess of a rank over the ratio, times the window's steps.
  std::vector<std::vector<double>> compute(R), wait(R), ratio_of(R), node_ratio(nodes.size());
  std::map<std::pair<int, int>, std::vector<double>> link_s;
  std::vector<double> step_times;
  double lost_s = 0, covered_steps = 0;
  for (const json* l : windows) {
    const json& w = (*l)["window"];
    const double steps = w.value("last_step", 0) - w.value("first_step", 0) + 1;
    double excess = 0;
    for (size_t r = 0; r < R; ++r) {
      compute[r].push_back(at(w, "own_s", r));
      wait[r].push_back(at(w, "wait_s", r));
      ratio_of[r].push_back(at(w, "ratio", r));
      const double over = std::isnan(at(w, "threshold", r)) ? ratio : at(w, "threshold", r);  // older logs: the ratio
      if (at(w, "ratio", r) > over) excess = std::max(excess, at(w, "own_s", r) - at(w, "expected_s", r));
    }
    for (size_t n = 0; n < nodes.size(); ++n) node_ratio[n].push_back(at(w, "node_ratio", n));
    for (const json& k : w.value("links", json::array()))
      link_s[{k.value("from", -1), k.value("to", -1)}].push_back(k.value("s", 0.0));
    lost_s += steps * excess;
    covered_steps += steps;
    step_times.push_back(l->value("step_time_s", 0.0));
  }
  const double stepping_s = covered_steps * median(step_times);
  auto place = [&](size_t r) {
    return "stage " + std::to_string(static_cast<int>(at(last, "rank_stage", r))) + ", replica " +
           std::to_string(static_cast<int>(at(last, "rank_replica", r))) + ", " +
           nodes.at(static_cast<size_t>(at(last, "rank_node", r)));
  };

  StragglerReport out;
  json ranks = json::array(), node_rows = json::array(), links = json::array();
  std::string& t = out.text;
  t += "  stragglers: " + std::to_string(windows.size()) + " windows, steps " +
       std::to_string((*windows.front())["window"].value("first_step", 0)) + "-" + std::to_string(last.value("last_step", 0)) +
       ", reported above " + fmt("%.2fx", ratio) + " their peers\n";
  t += "    rank  stage  replica  node          own time/step  wait/step   x peers\n";
  size_t slowest_rank = 0;
  for (size_t r = 0; r < R; ++r) {
    const double c = median(compute[r]), w = median(wait[r]), x = median(ratio_of[r]);
    if (x > median(ratio_of[slowest_rank])) slowest_rank = r;
    ranks.push_back({{"rank", r}, {"where", place(r)}, {"own_s", c}, {"wait_s", w}, {"ratio", x}});
    if (R <= 32 || x > ratio)  // a large job lists only its ranks over the ratio
      t += fmt("    %4zu", r) + fmt("  %5.0f", at(last, "rank_stage", r)) + fmt("  %7.0f", at(last, "rank_replica", r)) + "  " +
           fmt("%-12s", nodes.at(static_cast<size_t>(at(last, "rank_node", r))).c_str()) + fmt("  %9.2f ms", 1e3 * c) +
           fmt("  %7.2f ms", 1e3 * w) + fmt("   %5.2f", x) + "\n";
  }
  t += "    slowest rank: rank " + std::to_string(slowest_rank) + " (" + place(slowest_rank) + "), " +
       fmt("%.2fx", median(ratio_of[slowest_rank])) + " its peers\n";
  out.json["slowest_rank"] = {{"rank", slowest_rank}, {"ratio", median(ratio_of[slowest_rank])}};
  if (nodes.size() >= 2) {
    t += "    node          ranks        own time/step  wait/step   x other nodes\n";
    size_t slowest_node = 0;
    for (size_t n = 0; n < nodes.size(); ++n) {
      std::vector<double> c, w;
      std::string members;
      for (size_t r = 0; r < R; ++r)
        if (static_cast<size_t>(at(last, "rank_node", r)) == n) {
          c.push_back(median(compute[r]));
          w.push_back(median(wait[r]));
          members += (members.empty() ? "" : ",") + std::to_string(r);
        }
      const double x = median(node_ratio[n]);
      if (x > median(node_ratio[slowest_node])) slowest_node = n;
      node_rows.push_back({{"node", nodes[n]}, {"ranks", members}, {"own_s", median(c)}, {"wait_s", median(w)}, {"ratio", x}});
      t += "    " + fmt("%-12s", nodes[n].c_str()) + "  " + fmt("%-11s", members.c_str()) + fmt("  %9.2f ms", 1e3 * median(c)) +
           fmt("  %7.2f ms", 1e3 * median(w)) + fmt("   %5.2f", x) + "\n";
    }
    t += "    slowest node: " + nodes[slowest_node] + ", " + fmt("%.2fx", median(node_ratio[slowest_node])) + " the other nodes\n";
    out.json["slowest_node"] = {{"node", nodes[slowest_node]}, {"ratio", median(node_ratio[slowest_node])}};
  }
  // Links: each against the median of the others of its kind (within a node, across nodes).
  auto node_of = [&](int r) { return nodes.at(static_cast<size_t>(at(last, "rank_node", static_cast<size_t>(r)))); };
  for (const auto& [ends, s] : link_s) {
    const bool crosses = node_of(ends.first) != node_of(ends.second);
    std::vector<double> others;
    for (const auto& [o, os] : link_s)
      if (o != ends && (node_of(o.first) != node_of(o.second)) == crosses) others.push_back(median(os));
    links.push_back({{"from", ends.first}, {"to", ends.second}, {"crosses_nodes", crosses}, {"s", median(s)},
                     {"ratio", others.empty() ? 1.0 : median(s) / median(others)}});
  }
  if (!links.empty()) {
    const json& worst = *std::max_element(links.begin(), links.end(),
                                          [](const json& a, const json& b) { return a["ratio"].get<double>() < b["ratio"].get<double>(); });
    const int from = worst["from"], to = worst["to"];
    t += "    slowest link: rank " + std::to_string(from) + " -> rank " + std::to_string(to) + " (" + node_of(from) +
         (worst["crosses_nodes"].get<bool>() ? " -> " + node_of(to) : "") + "), " +
         fmt("%.2f ms", 1e3 * worst["s"].get<double>()) + " per message waited for, " +
         fmt("%.2fx", worst["ratio"].get<double>()) + " the other links " +
         (worst["crosses_nodes"].get<bool>() ? "across nodes" : "within a node") + "\n";
  }

  // What the run flagged, and when.
  struct Seen {
    int first = 0, last = 0;
    double worst = 0;
  };
  std::map<std::string, Seen> seen;
  for (const json& l : lines)
    for (const json& s : l.value("stragglers", json::array())) {
      Seen& e = seen[s.value("name", "?")];
      const int step = l.value("step", 0);
      if (!e.first) e.first = step;
      e.last = step;
      e.worst = std::max(e.worst, s.value("ratio", 0.0));
    }
  json flagged = json::array();
  for (const auto& [name, e] : seen) {
    t += "    flagged: " + name + ", steps " + std::to_string(e.first) + "-" + std::to_string(e.last) + fmt(" (up to %.2fx)", e.worst) + "\n";
    flagged.push_back({{"name", name}, {"first_step", e.first}, {"last_step", e.last}, {"worst_ratio", e.worst}});
  }
  if (seen.empty()) t += "    flagged: none\n";
  t += "    time lost to stragglers: " + fmt("%.2f s", lost_s) + " of " + fmt("%.2f s", stepping_s) + " of steps (" +
       fmt("%.1f%%", stepping_s > 0 ? 100 * lost_s / stepping_s : 0) + ")\n";
  out.json["ranks"] = ranks;
  out.json["nodes"] = node_rows;
  out.json["links"] = links;
  out.json["flagged"] = flagged;
  out.json["lost_s"] = lost_s;
  out.json["stepping_s"] = stepping_s;
  return out;
}

}  // namespace pipetrain
