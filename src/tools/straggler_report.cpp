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
  return w.contains(key) && w[key].is_array() && i < w[key].size() && w[key][i].is_number() ? w[key][i].get<double>()
                                                                                            : NAN;
}

// The straggler windows of the last rank count logged (a run resumed on another layout had other
// ranks), as series: per rank, node and link one figure per window; and the time lost (per window,
// the largest excess of a rank over the ratio, times the window's steps).
struct WindowSeries {
  std::vector<const json*> lines;  // the logged steps that closed a window
  const json* last = nullptr;      // the newest window
  size_t ranks = 0;
  std::vector<std::string> nodes;
  std::vector<std::vector<double>> compute, wait, ratio, node_ratio;
  std::map<std::pair<int, int>, std::vector<double>> link_s;
  double lost_s = 0, stepping_s = 0;

  std::string node_of(size_t r) const { return nodes.at(static_cast<size_t>(at(*last, "rank_node", r))); }
  std::string place(size_t r) const {
    return "stage " + std::to_string(static_cast<int>(at(*last, "rank_stage", r))) + ", replica " +
           std::to_string(static_cast<int>(at(*last, "rank_replica", r))) + ", " + node_of(r);
  }
};

}  // namespace

double window_lost_s(const json& w, double ratio) {
  const double steps = w.value("last_step", 0) - w.value("first_step", 0) + 1;
  double excess = 0;
  const size_t ranks = w.contains("own_s") ? w["own_s"].size() : 0;
  for (size_t r = 0; r < ranks; ++r) {
    const double over = std::isnan(at(w, "threshold", r)) ? ratio : at(w, "threshold", r);  // older logs: the ratio
    if (at(w, "ratio", r) > over) excess = std::max(excess, at(w, "own_s", r) - at(w, "expected_s", r));
  }
  return steps * excess;
}

namespace {

bool gather(const std::vector<json>& lines, double ratio, WindowSeries& ws) {
  for (const json& l : lines)
    if (l.contains("window") && l["window"].is_object() && l["window"].contains("own_s")) ws.lines.push_back(&l);
  if (ws.lines.empty()) return false;
  ws.last = &(*ws.lines.back())["window"];
  ws.ranks = (*ws.last)["own_s"].size();
  ws.lines.erase(std::remove_if(ws.lines.begin(), ws.lines.end(),
                                [&](const json* l) { return (*l)["window"]["own_s"].size() != ws.ranks; }),
                 ws.lines.end());
  ws.nodes = ws.last->value("nodes", std::vector<std::string>{});
  ws.compute.resize(ws.ranks);
  ws.wait.resize(ws.ranks);
  ws.ratio.resize(ws.ranks);
  ws.node_ratio.resize(ws.nodes.size());
  std::vector<double> step_times;
  double covered_steps = 0;
  for (const json* l : ws.lines) {
    const json& w = (*l)["window"];
    const double steps = w.value("last_step", 0) - w.value("first_step", 0) + 1;
    for (size_t r = 0; r < ws.ranks; ++r) {
      ws.compute[r].push_back(at(w, "own_s", r));
      ws.wait[r].push_back(at(w, "wait_s", r));
      ws.ratio[r].push_back(at(w, "ratio", r));
    }
    for (size_t n = 0; n < ws.nodes.size(); ++n) ws.node_ratio[n].push_back(at(w, "node_ratio", n));
    for (const json& k : w.value("links", json::array()))
      ws.link_s[{k.value("from", -1), k.value("to", -1)}].push_back(k.value("s", 0.0));
    ws.lost_s += window_lost_s(w, ratio);
    covered_steps += steps;
    step_times.push_back(l->value("step_time_s", 0.0));
  }
  ws.stepping_s = covered_steps * median(step_times);
  return true;
}

// A row per rank (a large job lists only its ranks over the ratio) and the slowest rank.
void rank_rows(const WindowSeries& ws, double ratio, StragglerReport& out) {
  std::string& t = out.text;
  json ranks = json::array();
  t += "    rank  stage  replica  node          own time/step  wait/step   x peers\n";
  size_t slowest = 0;
  for (size_t r = 0; r < ws.ranks; ++r) {
    const double c = median(ws.compute[r]), w = median(ws.wait[r]), x = median(ws.ratio[r]);
    if (x > median(ws.ratio[slowest])) slowest = r;
    ranks.push_back({{"rank", r}, {"where", ws.place(r)}, {"own_s", c}, {"wait_s", w}, {"ratio", x}});
    if (ws.ranks <= 32 || x > ratio)
      t += fmt("    %4zu", r) + fmt("  %5.0f", at(*ws.last, "rank_stage", r)) +
           fmt("  %7.0f", at(*ws.last, "rank_replica", r)) + "  " + fmt("%-12s", ws.node_of(r).c_str()) +
           fmt("  %9.2f ms", 1e3 * c) + fmt("  %7.2f ms", 1e3 * w) + fmt("   %5.2f", x) + "\n";
  }
  t += "    slowest rank: rank " + std::to_string(slowest) + " (" + ws.place(slowest) + "), " +
       fmt("%.2fx", median(ws.ratio[slowest])) + " its peers\n";
  out.json["slowest_rank"] = {{"rank", slowest}, {"ratio", median(ws.ratio[slowest])}};
  out.json["ranks"] = ranks;
}

// A row per node and the slowest node, where the job spans two or more.
void node_rows(const WindowSeries& ws, StragglerReport& out) {
  json rows = json::array();
  if (ws.nodes.size() >= 2) {
    std::string& t = out.text;
    t += "    node          ranks        own time/step  wait/step   x other nodes\n";
    size_t slowest = 0;
    for (size_t n = 0; n < ws.nodes.size(); ++n) {
      std::vector<double> c, w;
      std::string members;
      for (size_t r = 0; r < ws.ranks; ++r)
        if (static_cast<size_t>(at(*ws.last, "rank_node", r)) == n) {
          c.push_back(median(ws.compute[r]));
          w.push_back(median(ws.wait[r]));
          members += (members.empty() ? "" : ",") + std::to_string(r);
        }
      const double x = median(ws.node_ratio[n]);
      if (x > median(ws.node_ratio[slowest])) slowest = n;
      rows.push_back(
          {{"node", ws.nodes[n]}, {"ranks", members}, {"own_s", median(c)}, {"wait_s", median(w)}, {"ratio", x}});
      t += "    " + fmt("%-12s", ws.nodes[n].c_str()) + "  " + fmt("%-11s", members.c_str()) +
           fmt("  %9.2f ms", 1e3 * median(c)) + fmt("  %7.2f ms", 1e3 * median(w)) + fmt("   %5.2f", x) + "\n";
    }
    t += "    slowest node: " + ws.nodes[slowest] + ", " + fmt("%.2fx", median(ws.node_ratio[slowest])) +
         " the other nodes\n";
    out.json["slowest_node"] = {{"node", ws.nodes[slowest]}, {"ratio", median(ws.node_ratio[slowest])}};
  }
  out.json["nodes"] = rows;
}

// Links: each against the median of the others of its kind (within a node, across nodes); the slowest named.
void link_rows(const WindowSeries& ws, StragglerReport& out) {
  json links = json::array();
  for (const auto& [ends, s] : ws.link_s) {
    const bool crosses = ws.node_of(ends.first) != ws.node_of(ends.second);
    std::vector<double> others;
    for (const auto& [o, os] : ws.link_s)
      if (o != ends && (ws.node_of(o.first) != ws.node_of(o.second)) == crosses) others.push_back(median(os));
    links.push_back({{"from", ends.first},
                     {"to", ends.second},
                     {"crosses_nodes", crosses},
                     {"s", median(s)},
                     {"ratio", others.empty() ? 1.0 : median(s) / median(others)}});
  }
  if (!links.empty()) {
    const json& worst = *std::max_element(links.begin(), links.end(), [](const json& a, const json& b) {
      return a["ratio"].get<double>() < b["ratio"].get<double>();
    });
    const int from = worst["from"], to = worst["to"];
    const bool crosses = worst["crosses_nodes"].get<bool>();
    out.text += "    slowest link: rank " + std::to_string(from) + " -> rank " + std::to_string(to) + " (" +
                ws.node_of(from) + (crosses ? " -> " + ws.node_of(to) : "") + "), " +
                fmt("%.2f ms", 1e3 * worst["s"].get<double>()) + " per message waited for, " +
                fmt("%.2fx", worst["ratio"].get<double>()) + " the other links " +
                (crosses ? "across nodes" : "within a node") + "\n";
  }
  out.json["links"] = links;
}

// What the run flagged, and when.
void flagged_rows(const std::vector<json>& lines, StragglerReport& out) {
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
    out.text += "    flagged: " + name + ", steps " + std::to_string(e.first) + "-" + std::to_string(e.last) +
                fmt(" (up to %.2fx)", e.worst) + "\n";
    flagged.push_back({{"name", name}, {"first_step", e.first}, {"last_step", e.last}, {"worst_ratio", e.worst}});
  }
  if (seen.empty()) out.text += "    flagged: none\n";
  out.json["flagged"] = flagged;
}

}  // namespace

StragglerReport straggler_report(const std::vector<json>& lines, double ratio) {
  WindowSeries ws;
  if (!gather(lines, ratio, ws)) return {"", nullptr};
  StragglerReport out;
  out.text += "  stragglers: " + std::to_string(ws.lines.size()) + " windows, steps " +
              std::to_string((*ws.lines.front())["window"].value("first_step", 0)) + "-" +
              std::to_string(ws.last->value("last_step", 0)) + ", reported above " + fmt("%.2fx", ratio) +
              " their peers\n";
  rank_rows(ws, ratio, out);
  node_rows(ws, out);
  link_rows(ws, out);
  flagged_rows(lines, out);
  out.text += "    time lost to stragglers: " + fmt("%.2f s", ws.lost_s) + " of " + fmt("%.2f s", ws.stepping_s) +
              " of steps (" + fmt("%.1f%%", ws.stepping_s > 0 ? 100 * ws.lost_s / ws.stepping_s : 0) + ")\n";
  out.json["lost_s"] = ws.lost_s;
  out.json["stepping_s"] = ws.stepping_s;
  return out;
}

}  // namespace pipetrain
