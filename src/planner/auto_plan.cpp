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

// The ZeRO levels searched: 3 both releasing each layer's weights after every pass (least memory,
// a gather before every pass) and keeping them for the step (one gather a step).
struct Sharding {
  int zero, reshard;  // parallel.zero, parallel.reshard_after_forward (-1: unset)
};
constexpr Sharding kShardings[] = {{0, -1}, {1, -1}, {2, -1}, {3, 1}, {3, 0}};

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::string describe(const RunSpec& s, bool with_batch) {
  const auto& p = s.parallel;
  std::string out = grid_text(p.tp, p.pp, p.dp) + ", M " + std::to_string(p.micro_batches) + ", " + p.schedule->name;
  if (p.virtual_stages > 1) out += " (" + std::to_string(p.virtual_stages) + " chunks)";
  out += std::string(", recompute ") + name_of(p.recompute) + ", " + name_of(p.partition);
  if (p.dp > 1) out += ", zero " + std::to_string(p.zero);
  if (p.dp > 1 && p.zero == 3)
    out += p.reshards_after_forward() ? " (resharded after forward)" : " (kept for the step)";
  if (p.sequence_parallel) out += ", sequence parallel";
  if (p.ep > 1) out += ", ep " + std::to_string(p.ep);
  if (with_batch) out += ", global batch " + std::to_string(s.train.global_batch);
  return out;
}

std::string set_line(const RunSpec& s, bool with_batch) {
  const auto& p = s.parallel;
  return "--set parallel.tp=" + std::to_string(p.tp) + " --set parallel.pp=" + std::to_string(p.pp) +
         " --set parallel.dp=" + std::to_string(p.dp) +
         " --set parallel.micro_batches=" + std::to_string(p.micro_batches) +
         " --set parallel.schedule=" + p.schedule->name +
         " --set parallel.virtual_stages=" + std::to_string(p.virtual_stages) +
         " --set parallel.recompute=" + name_of(p.recompute) + " --set parallel.partition=" + name_of(p.partition) +
         " --set parallel.zero=" + std::to_string(p.zero) +
         (p.zero == 3
              ? std::string(" --set parallel.reshard_after_forward=") + (p.reshards_after_forward() ? "true" : "false")
              : "") +
         " --set parallel.sequence_parallel=" + (p.sequence_parallel ? "true" : "false") +
         (s.model.moe.on() ? " --set parallel.ep=" + std::to_string(p.ep) : "") +
         (with_batch ? " --set train.global_batch=" + std::to_string(s.train.global_batch) : "");
}

// Every layout of one grid (tp x pp x dp; for a mixture of experts each ep dividing dp and the
// experts) at one global batch that the model and schedules allow,
// planned into `all` when it fits the memory budget. Returns how many were considered and how
// many of them were over the budget.
std::pair<int, int> plan_grid(const RunSpec& spec, int tp, int pp, int dp, int world, const MachineCosts& costs,
                              double memory_per_rank, bool with_batch, std::vector<LayoutChoice>& all, AutoPlan& out) {
  int considered = 0, over = 0;
  std::vector<int> expert_ranks = {1};  // a mixture of experts: every split of its experts over replicas
  if (spec.model.moe.on())
    for (int ep : divisors(dp))
      if (ep > 1 && spec.model.moe.experts % ep == 0) expert_ranks.push_back(ep);
  for (int M : divisors(spec.train.global_batch / dp))
    for (const ScheduleKind* kind : all_schedules())
      for (int V = 1; V <= (kind->chunked ? 4 : 1); ++V)
        for (Recompute mode : {Recompute::none, Recompute::block, Recompute::stage})
          for (Partition part : {Partition::uniform, Partition::balanced})
            for (const Sharding& shard : kShardings)
              for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp)
                for (int ep : expert_ranks) {
                  if (dp == 1 && shard.zero > 0) continue;  // one replica shards nothing
                  if (kind->splits_backward && mode != Recompute::none) continue;
                  // One stage: every schedule and partition is the same step, planned once, as the
                  // first registered schedule (gpipe).
                  if (pp == 1 && (part == Partition::balanced || kind != all_schedules().front())) continue;
                  RunSpec s = spec;
                  auto& p = s.parallel;
                  p.tp = tp;
                  p.pp = pp;
                  p.dp = dp;
                  p.micro_batches = M;
                  p.schedule = kind;
                  p.virtual_stages = V;
                  p.recompute = mode;
                  p.partition = part;
                  p.zero = shard.zero;
                  p.reshard_after_forward = shard.reshard;
                  p.sequence_parallel = sp == 1;
                  p.ep = ep;
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
                  ++considered;
                  const double need = make_plan(s).largest_memory_bytes(s);
                  if (out.least_memory == 0 || need < out.least_memory) {
                    out.least_memory = need;
                    out.least_memory_layout = describe(s, with_batch);
                  }
                  if (tp == 1 && (out.least_memory_tp1 == 0 || need < out.least_memory_tp1)) {
                    out.least_memory_tp1 = need;
                    out.least_memory_tp1_layout = describe(s, with_batch);
                  }
                  if (memory_per_rank > 0 && need > memory_per_rank) {
                    ++over;
                    continue;
                  }
                  all.push_back({s, predict_step(s, costs), need, set_line(s, with_batch), describe(s, with_batch)});
                }
  return {considered, over};
}

// The layouts of `world` ranks, fastest (most tokens per second) first, all of them.
AutoPlan search(const RunSpec& spec, int world, const MachineCosts& costs, double memory_per_rank, bool search_batch,
                int max_tp) {
  AutoPlan out;
  out.max_tp = max_tp;
  for (int k = 0; k <= (search_batch ? 4 : 0); ++k) out.global_batches.push_back(spec.train.global_batch << k);
  std::vector<LayoutChoice> all;
  for (int tp : divisors(world))
    for (int pp : divisors(world / tp)) {
      const int dp = world / tp / pp;
      ++out.refused.grids;
      RunSpec t = spec;
      t.parallel.tp = tp;
      if (pp > spec.model.n_layer) {
        ++out.refused.layers;
        continue;
      }
      if (tp > max_tp || !tensor_parallel_problem(t).empty()) {
        ++out.refused.heads;
        continue;
      }
      int grid_considered = 0, grid_over = 0;
      for (int G : out.global_batches) {
        if (G % dp) continue;
        RunSpec b = spec;
        b.train.global_batch = G;
        const auto [considered, over] = plan_grid(b, tp, pp, dp, world, costs, memory_per_rank, search_batch, all, out);
        grid_considered += considered;
        grid_over += over;
      }
      if (std::none_of(out.global_batches.begin(), out.global_batches.end(), [&](int G) { return G % dp == 0; }))
        ++out.refused.batch;
      else if (grid_considered > 0 && grid_over == grid_considered) ++out.refused.memory;
      out.considered += grid_considered;
      out.over_memory += grid_over;
    }
  // Most tokens per second first (at one global batch: the shortest step); between equals, the
  // one needing less memory.
  std::sort(all.begin(), all.end(), [](const LayoutChoice& a, const LayoutChoice& b) {
    if (a.predicted.tokens_per_s != b.predicted.tokens_per_s)
      return a.predicted.tokens_per_s > b.predicted.tokens_per_s;
    return a.memory_bytes < b.memory_bytes;
  });
  out.best = std::move(all);
  return out;
}

std::string fixed(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// Where a layout's step goes, on its slowest rank: the forwards and backwards (the pipeline's
// critical path, its bubble and any tensor-group exchanges or exposed ZeRO-3 gathers inside), the
// data-parallel reduction its backward does not hide (of all of it), the update; and its memory.
std::string step_parts(const LayoutChoice& c) {
  const StepPrediction& p = c.predicted;
  char line[320];
  std::snprintf(
      line, sizeof line,
      "%.1f ms = forwards and backwards %.1f (bubble %.2f%s%s) + exposed reduction %.1f (of %.1f) + update %.1f; %s "
      "per rank",
      1e3 * p.step_s, 1e3 * p.pipeline_s, p.bubble,
      p.tp_comm_s > 0 ? (", tensor exchanges " + fixed(1e3 * p.tp_comm_s, "%.1f")).c_str() : "",
      p.gather_s > 0 ? (", exposed layer gathers " + fixed(1e3 * p.gather_exposed_s, "%.1f") + " of " +
                        fixed(1e3 * p.gather_s, "%.1f"))
                           .c_str()
                     : "",
      1e3 * p.reduce_exposed_s, 1e3 * p.reduce_s, 1e3 * p.optimizer_s, human_bytes(c.memory_bytes).c_str());
  return line;
}

// Why the first layout wins, against the fastest of the other kind: data parallel first (one
// stage) against a pipeline, or a pipeline against the best single stage.
std::string why_first(const AutoPlan& plan) {
  const LayoutChoice& best = plan.best.front();
  const bool pipelined = best.spec.parallel.pp > 1;
  auto other = std::find_if(plan.best.begin(), plan.best.end(),
                            [&](const LayoutChoice& c) { return (c.spec.parallel.pp > 1) != pipelined; });
  std::string line = "why #1: " + step_parts(best);
  if (other == plan.best.end())
    return line + " (every layout that fits is " + (pipelined ? "pipelined" : "one stage") + ")";
  line += std::string("; the fastest ") + (pipelined ? "with one stage" : "pipelined") + " (" +
          grid_text(other->spec.parallel.tp, other->spec.parallel.pp, other->spec.parallel.dp) +
          "): " + step_parts(*other);
  return line;
}

// What binds the search of `world` ranks, and what to change, in a line each.
std::vector<std::string> binding_constraints(const RunSpec& spec, int world, double memory_per_rank, bool search_batch,
                                             const AutoPlan& plan) {
  std::vector<std::string> lines;
  const GridRefusals& r = plan.refused;
  const int G = plan.global_batches.back(), L = spec.model.n_layer;
  int tp_max = 1;
  for (int tp = 1; tp <= plan.max_tp; ++tp) {
    RunSpec t = spec;
    t.parallel.tp = tp;
    if (tensor_parallel_problem(t).empty()) tp_max = tp;
  }
  if (plan.best.empty()) {
    if (r.layers + r.batch + r.heads == r.grids)
      lines.push_back("every way to lay out " + std::to_string(world) + " ranks needs more pipeline stages than the " +
                      std::to_string(L) + " blocks, more replicas than the global batch of " + std::to_string(G) +
                      " has samples (dp must divide it), or more tensor ranks than the heads allow (at most " +
                      std::to_string(tp_max) + "): at most tp " + std::to_string(tp_max) + " x pp " +
                      std::to_string(L) + " x dp " + std::to_string(G) + " = " +
                      std::to_string(static_cast<int64_t>(tp_max) * L * G) + " ranks can be used; launch fewer ranks" +
                      (search_batch ? "" : " or raise train.global_batch (--global-batch auto searches it)"));
    else if (r.memory > 0)
      lines.push_back("memory binds: every layout needs more than " + human_bytes(memory_per_rank) +
                      " per rank; the least is " + human_bytes(plan.least_memory) + " (" + plan.least_memory_layout +
                      "): more ranks (tensor or pipeline), recompute, or devices with more memory");
    return lines;
  }
  lines.push_back(why_first(plan));
  const LayoutChoice& best = plan.best.front();
  const auto& p = best.spec.parallel;
  const int per_replica = best.spec.train.global_batch / p.dp;
  if (best.spec.samples_per_micro_batch() == 1 && p.pp > 1 && best.predicted.bubble > 0.2)
    lines.push_back("the global batch per replica binds: " + std::to_string(best.spec.train.global_batch) + " / dp " +
                    std::to_string(p.dp) + " = " + std::to_string(per_replica) + " sample" +
                    (per_replica > 1 ? "s" : "") + ", at most " + std::to_string(per_replica) + " micro-batch" +
                    (per_replica > 1 ? "es" : "") + " for " + std::to_string(p.pp) + " stages: bubble " +
                    fixed(best.predicted.bubble, "%.2f") + "; a larger train.global_batch" +
                    (search_batch ? "" : " (--global-batch auto searches it)") + " or fewer ranks fills the pipeline");
  if (memory_per_rank > 0 && p.tp > 1 && plan.least_memory_tp1 > memory_per_rank)
    lines.push_back("memory binds: without tensor parallelism no layout fits in " + human_bytes(memory_per_rank) +
                    " per rank (the least needs " + human_bytes(plan.least_memory_tp1) + ": " +
                    plan.least_memory_tp1_layout + "); tp " + std::to_string(p.tp) + " splits each stage to fit");
  return lines;
}

}  // namespace

AutoPlan auto_plan(const RunSpec& spec, int world, const MachineCosts& costs, double memory_per_rank, int keep,
                   bool search_batch, int max_tp) {
  AutoPlan out = search(spec, world, costs, memory_per_rank, search_batch, std::min(max_tp, kMaxTensorRanks));
  out.binding = binding_constraints(spec, world, memory_per_rank, search_batch, out);
  if (static_cast<int>(out.best.size()) > keep) out.best.resize(keep);
  return out;
}

void add_scaling_line(AutoPlan& plan, const RunSpec& spec, int world, const MachineCosts& costs, double memory_per_rank,
                      bool search_batch) {
  if (plan.best.empty() || world % 2 != 0) return;
  const AutoPlan half = search(spec, world / 2, costs, memory_per_rank, search_batch, plan.max_tp);
  if (half.best.empty()) return;
  plan.binding.push_back(
      "scaling: " + std::to_string(world) + " ranks reach " +
      fixed(plan.best.front().predicted.tokens_per_s / half.best.front().predicted.tokens_per_s, "%.2f") +
      "x the tokens/s of the best layout of " + std::to_string(world / 2) + " (2x would be linear)");
}

std::string auto_plan_text(const AutoPlan& plan, int world, const MachineCosts& costs, double memory_per_rank) {
  std::ostringstream os;
  os << "plan --auto: " << plan.considered << " layouts of " << world << " rank" << (world > 1 ? "s" : "")
     << " considered";
  if (memory_per_rank > 0) os << ", " << plan.over_memory << " over " << human_bytes(memory_per_rank) << " per rank";
  os << "; step times predicted with " << costs.source << "\n";
  const GridRefusals& r = plan.refused;
  os << "grids tp x pp x dp: " << r.grids << " tried; refused: " << r.layers << " with more stages than blocks, "
     << r.batch << " with more replicas than the global batch allows, " << r.heads
     << " with a tp the heads do not allow (or above " << plan.max_tp << ", a node), " << r.memory
     << " over the memory budget in every layout\n";
  if (plan.global_batches.size() > 1) {
    os << "global batches searched:";
    for (int G : plan.global_batches) os << " " << G;
    os << " (ranked by tokens/s)\n";
  }
  auto binding = [&] {
    for (const std::string& b : plan.binding)
      os << (b.rfind("scaling: ", 0) == 0 || b.rfind("why #1: ", 0) == 0 ? "" : "binding: ") << b << "\n";
  };
  if (plan.best.empty()) {
    os << "no layout fits\n";
    binding();
    return os.str();
  }
  char line[400];
  std::snprintf(line, sizeof line, "  %-3s %10s %12s %8s %17s %11s   %s\n", "#", "step", "tokens/s", "bubble",
                "reduce exposed/all", "memory", "layout");
  os << line;
  for (size_t i = 0; i < plan.best.size(); ++i) {
    const LayoutChoice& c = plan.best[i];
    std::snprintf(line, sizeof line, "  %-3zu %8.2f ms %12.0f %8.4f %8.1f/%5.1f ms %11s   %s\n", i + 1,
                  1e3 * c.predicted.step_s, c.predicted.tokens_per_s, c.predicted.bubble,
                  1e3 * c.predicted.reduce_exposed_s, 1e3 * c.predicted.reduce_s, human_bytes(c.memory_bytes).c_str(),
                  c.summary.c_str());
    os << line;
  }
  binding();
  os << "run the first with:\n  " << plan.best.front().sets << "\n";
  return os.str();
}

std::string auto_plan_json(const AutoPlan& plan, int world, const MachineCosts& costs, double memory_per_rank) {
  nlohmann::json j;
  j["world"] = world;
  j["costs"] = costs.source;
  j["considered"] = plan.considered;
  j["over_memory"] = plan.over_memory;
  j["refused_grids"] = {{"tried", plan.refused.grids},
                        {"layers", plan.refused.layers},
                        {"batch", plan.refused.batch},
                        {"heads", plan.refused.heads},
                        {"memory", plan.refused.memory}};
  j["global_batches"] = plan.global_batches;
  j["binding"] = plan.binding;
  if (memory_per_rank > 0) j["memory_per_rank"] = memory_per_rank;
  j["best"] = nlohmann::json::array();
  for (const LayoutChoice& c : plan.best)
    j["best"].push_back({{"step_s", c.predicted.step_s},
                         {"tokens_per_s", c.predicted.tokens_per_s},
                         {"bubble", c.predicted.bubble},
                         {"reduce_s", c.predicted.reduce_s},
                         {"reduce_exposed_s", c.predicted.reduce_exposed_s},
                         {"gather_s", c.predicted.gather_s},
                         {"gather_exposed_s", c.predicted.gather_exposed_s},
                         {"memory_bytes", c.memory_bytes},
                         {"tp", c.spec.parallel.tp},
                         {"pp", c.spec.parallel.pp},
                         {"dp", c.spec.parallel.dp},
                         {"zero", c.spec.parallel.zero},
                         {"ep", c.spec.parallel.ep},
                         {"ep_comm_s", c.predicted.ep_comm_s},
                         {"global_batch", c.spec.train.global_batch},
                         {"layout", c.summary},
                         {"set", c.sets}});
  return j.dump(2) + "\n";
}

}  // namespace pipetrain
