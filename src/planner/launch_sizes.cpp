#include "pipetrain/planner/launch_sizes.hpp"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipetrain/util/files.hpp"

namespace pipetrain {
namespace {

int positive_int(const std::string& text, const std::string& whole) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < 1)
    throw SpecError("--nodes " + whole + ": not a node count or range (e.g. 4, or 2-8 as sbatch --nodes takes it)");
  return value;
}

// A word as the shell reads it back: quoted where it holds anything but plain characters.
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of(
                                          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                          "0123456789_./=:,+-@%") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string nodes_word(int n) { return std::to_string(n) + (n == 1 ? " node" : " nodes"); }

}  // namespace

NodeRange parse_node_range(const std::string& text) {
  const size_t dash = text.find('-');
  NodeRange r;
  r.min = positive_int(text.substr(0, dash), text);
  r.max = dash == std::string::npos ? r.min : positive_int(text.substr(dash + 1), text);
  if (r.max < r.min) throw SpecError("--nodes " + text + ": the range runs from its smaller count to its larger");
  return r;
}

std::vector<SizePlan> plan_sizes(const RunSpec& spec, NodeRange range, int ranks_per_node, const MachineCosts& costs,
                                 double memory_per_rank, bool search_batch) {
  std::vector<SizePlan> sizes;
  for (int n = range.min; n <= range.max; ++n) {
    const int ranks = n * ranks_per_node;
    sizes.push_back({n, ranks, auto_plan(spec, ranks, costs, memory_per_rank, 1, search_batch, ranks_per_node)});
  }
  return sizes;
}

std::string slurm_time_limit(double training_s) {
  const long minutes = static_cast<long>(std::ceil((1.25 * training_s + 600) / 60));
  const long days = minutes / (24 * 60), hours = minutes / 60 % 24, mins = minutes % 60;
  char text[48];
  if (days > 0) std::snprintf(text, sizeof text, "%ld-%02ld:%02ld:00", days, hours, mins);
  else std::snprintf(text, sizeof text, "%ld:%02ld:00", hours, mins);
  return text;
}

std::string sbatch_line(const JobRequest& job, int nodes, const LayoutChoice& pick) {
  std::string line = "sbatch --nodes=" + std::to_string(nodes) +
                     " --ntasks-per-node=" + std::to_string(job.ranks_per_node) +
                     " --time=" + slurm_time_limit(pick.predicted.step_s * pick.spec.run.steps) +
                     " jobs/train.sbatch --config " + shell_word(job.config);
  for (const std::string& o : job.overrides) line += " --set " + shell_word(o);
  return line + " " + pick.sets;
}

std::string sizes_text(const std::vector<SizePlan>& sizes, const RunSpec& spec, const MachineCosts& costs,
                       const JobRequest* sbatch) {
  std::ostringstream os;
  const SizePlan& first = sizes.front();
  os << "plan --auto over " << first.nodes << " to " << nodes_word(sizes.back().nodes) << " of "
     << first.ranks / first.nodes << " ranks each (run.steps = " << spec.run.steps << "); step times predicted with "
     << costs.source << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %5s %6s %11s %12s %12s %11s %9s   %s\n", "nodes", "ranks", "step", "tokens/s",
                "per node", "memory", "per node", "layout");
  os << line;
  std::snprintf(line, sizeof line, "  %5s %6s %11s %12s %12s %11s %9s\n", "", "", "", "", "", "per rank",
                ("vs " + std::to_string(first.nodes)).c_str());
  os << line;
  double base = 0;  // the smallest size's tokens/s per node, where one fits
  for (const SizePlan& s : sizes) {
    if (s.plan.best.empty()) {
      std::snprintf(line, sizeof line, "  %5d %6d   no layout fits: %s\n", s.nodes, s.ranks,
                    s.plan.binding.empty() ? "" : s.plan.binding.front().c_str());
      os << line;
      continue;
    }
    const LayoutChoice& c = s.plan.best.front();
    const double per_node = c.predicted.tokens_per_s / s.nodes;
    if (base == 0) base = per_node;
    std::snprintf(line, sizeof line, "  %5d %6d %8.2f ms %12.0f %12.0f %11s %8.2fx   %s\n", s.nodes, s.ranks,
                  1e3 * c.predicted.step_s, c.predicted.tokens_per_s, per_node, human_bytes(c.memory_bytes).c_str(),
                  per_node / base, c.summary.c_str());
    os << line;
  }
  os << (sbatch ? "submit each with:\n" : "run each with:\n");
  for (const SizePlan& s : sizes) {
    if (s.plan.best.empty()) continue;
    os << "  " << nodes_word(s.nodes) << ": "
       << (sbatch ? sbatch_line(*sbatch, s.nodes, s.plan.best.front()) : s.plan.best.front().sets) << "\n";
  }
  return os.str();
}

std::string sizes_json(const std::vector<SizePlan>& sizes, const MachineCosts& costs, const JobRequest* sbatch) {
  nlohmann::json j;
  j["costs"] = costs.source;
  j["ranks_per_node"] = sizes.front().ranks / sizes.front().nodes;
  j["sizes"] = nlohmann::json::array();
  for (const SizePlan& s : sizes) {
    nlohmann::json size = {{"nodes", s.nodes}, {"ranks", s.ranks}, {"binding", s.plan.binding}};
    if (!s.plan.best.empty()) {
      const LayoutChoice& c = s.plan.best.front();
      size["best"] = {{"step_s", c.predicted.step_s},
                      {"tokens_per_s", c.predicted.tokens_per_s},
                      {"tokens_per_s_per_node", c.predicted.tokens_per_s / s.nodes},
                      {"memory_bytes", c.memory_bytes},
                      {"tp", c.spec.parallel.tp},
                      {"pp", c.spec.parallel.pp},
                      {"dp", c.spec.parallel.dp},
                      {"layout", c.summary},
                      {"set", c.sets}};
      if (sbatch) size["sbatch"] = sbatch_line(*sbatch, s.nodes, c);
    }
    j["sizes"].push_back(size);
  }
  return j.dump(2) + "\n";
}

}  // namespace pipetrain
