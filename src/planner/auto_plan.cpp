#include "pipetrain/planner/auto_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipetrain/model/partition.hpp"
#include "pipetrain/planner/plan.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/util/files.hpp"

namespace pipetrain {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::string describe(const RunSpec& s) {
  const auto& p = s.parallel;
  std::string out = "pp " + std::to_string(p.pp) + " x dp " + std::to_string(p.dp) + ", M " +
                    std::to_string(p.micro_batches) + ", " + p.schedule->name;
  if (p.virtual_stages > 1) out += " (" + std::to_string(p.virtual_stages) + " chunks)";
  out += std::string(", recompute ") + name_of(p.recompute) + ", " + name_of(p.partition);
  if (p.dp > 1) out += ", zero " + std::to_string(p.zero);
  return out;
}

std::string set_line(const RunSpec& s) {
  const auto& p = s.parallel;
  return "--set parallel.pp=" + std::to_string(p.pp) + " --set parallel.dp=" + std::to_string(p.dp) +
         " --set parallel.micro_batches=" + std::to_string(p.micro_batches) +
         " --set parallel.schedule=" + p.schedule->name +
         " --set parallel.virtual_stages=" + std::to_string(p.virtual_stages) +
         " --set parallel.recompute=" + name_of(p.recompute) + " --set parallel.partition=" + name_of(p.partition) +
         " --set parallel.zero=" + std::to_string(p.zero);
}

}  // namespace

AutoPlan auto_plan(const RunSpec& spec, int world, const MachineCosts& costs, double memory_per_rank, int keep) {
  AutoPlan out;
  std::vector<LayoutChoice> all;
  for (int pp : divisors(world)) {
    const int dp = world / pp;
    if (pp > spec.model.n_layer || spec.train.global_batch % dp) continue;
    for (int M : divisors(spec.train.global_batch / dp))
      for (const ScheduleKind* kind : all_schedules())
        for (int V = 1; V <= (kind->chunked ? 4 : 1); ++V)
          for (Recompute mode : {Recompute::none, Recompute::block, Recompute::stage})
            for (Partition part : {Partition::uniform, Partition::balanced})
              for (int zero = 0; zero <= (dp > 1 ? 1 : 0); ++zero) {
                if (kind->splits_backward && mode != Recompute::none) continue;
                // One stage: every schedule and partition is the same step, planned once, as the
                // first registered schedule (gpipe).
                if (pp == 1 && (part == Partition::balanced || kind != all_schedules().front())) continue;
                RunSpec s = spec;
                auto& p = s.parallel;
                p.pp = pp;
                p.dp = dp;
                p.micro_batches = M;
                p.schedule = kind;
                p.virtual_stages = V;
                p.recompute = mode;
                p.partition = part;
                p.zero = zero;
                p.blocks_per_stage.clear();
                s.origins.clear();
                try {
                  validate_spec(s, world);
                } catch (const SpecError&) {
                  continue;  // a layout this model or schedule cannot run
                }
                if (part == Partition::balanced) {  // planned once when it splits as uniform does
                  RunSpec uniform = s;
                  uniform.parallel.partition = Partition::uniform;
                  if (partition_blocks(uniform) == partition_blocks(s)) continue;
                }
                ++out.considered;
                const double need = make_plan(s).largest_memory_bytes(s);
                if (memory_per_rank > 0 && need > memory_per_rank) {
                  ++out.over_memory;
                  continue;
                }
                all.push_back({s, predict_step(s, costs), need, set_line(s), describe(s)});
              }
  }
  // Fastest first; between equals, the one needing less memory.
  std::sort(all.begin(), all.end(), [](const LayoutChoice& a, const LayoutChoice& b) {
    if (a.predicted.step_s != b.predicted.step_s) return a.predicted.step_s < b.predicted.step_s;
    return a.memory_bytes < b.memory_bytes;
  });
  if (static_cast<int>(all.size()) > keep) all.resize(keep);
  out.best = std::move(all);
  return out;
}

std::string auto_plan_text(const AutoPlan& plan, int world, const MachineCosts& costs, double memory_per_rank) {
  std::ostringstream os;
  os << "plan --auto: " << plan.considered << " layouts of " << world << " rank" << (world > 1 ? "s" : "")
     << " considered";
  if (memory_per_rank > 0) os << ", " << plan.over_memory << " over " << human_bytes(memory_per_rank) << " per rank";
  os << "; step times predicted with " << costs.source << "\n";
  if (plan.best.empty()) {
    os << "no layout fits: more ranks, a smaller model or a smaller global batch\n";
    return os.str();
  }
  char line[400];
  std::snprintf(line, sizeof line, "  %-3s %10s %12s %8s %11s   %s\n", "#", "step", "tokens/s", "bubble", "memory",
                "layout");
  os << line;
  for (size_t i = 0; i < plan.best.size(); ++i) {
    const LayoutChoice& c = plan.best[i];
    std::snprintf(line, sizeof line, "  %-3zu %8.2f ms %12.0f %8.4f %11s   %s\n", i + 1, 1e3 * c.predicted.step_s,
                  c.predicted.tokens_per_s, c.predicted.bubble, human_bytes(c.memory_bytes).c_str(), c.summary.c_str());
    os << line;
  }
  os << "run the first with:\n  " << plan.best.front().sets << "\n";
  return os.str();
}

std::string auto_plan_json(const AutoPlan& plan, int world, const MachineCosts& costs, double memory_per_rank) {
  nlohmann::json j;
  j["world"] = world;
  j["costs"] = costs.source;
  j["considered"] = plan.considered;
  j["over_memory"] = plan.over_memory;
  if (memory_per_rank > 0) j["memory_per_rank"] = memory_per_rank;
  j["best"] = nlohmann::json::array();
  for (const LayoutChoice& c : plan.best)
    j["best"].push_back({{"step_s", c.predicted.step_s},
                         {"tokens_per_s", c.predicted.tokens_per_s},
                         {"bubble", c.predicted.bubble},
                         {"memory_bytes", c.memory_bytes},
                         {"layout", c.summary},
                         {"set", c.sets}});
  return j.dump(2) + "\n";
}

}  // namespace pipetrain
