// plan's answers about cost: the budget of a step and a run on a machine, and the warning when a
// layout's stages are far from even.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "pipetrain/model/partition.hpp"
#include "pipetrain/planner/plan.hpp"
#include "pipetrain/planner/step_time.hpp"
#include "pipetrain/schedule/registry.hpp"

namespace pipetrain {
namespace {

std::string human(double x, const char* unit, double base = 1000) {
  const char* decimal[] = {"", "k", "M", "G", "T", "P", "E"};
  const char* binary[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  int p = 0;
  for (; std::fabs(x) >= base && p < 6; ++p) x /= base;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g %s%s", x, base == 1024 ? binary[p] : decimal[p], unit);
  return buf;
}

std::string duration(double s) {
  char buf[48];
  if (s < 1) std::snprintf(buf, sizeof buf, "%.1f ms", 1e3 * s);
  else if (s < 120) std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  return buf;
}

}  // namespace

nlohmann::json budget_json(const RunSpec& spec, const Plan& plan, const MachineCosts& costs, double memory_per_rank) {
  const StepPrediction p = predict_step(spec, costs);
  const int world = spec.parallel.tp * spec.parallel.pp * spec.parallel.dp;
  nlohmann::json j;
  j["costs"] = costs.source;
  j["flops_per_step"] = p.flops;
  j["p2p_bytes_per_step"] = p.p2p_bytes;
  j["reduce_bytes_per_step"] = p.reduce_bytes;
  j["step_s"] = p.step_s;
  j["pipeline_s"] = p.pipeline_s;
  j["bubble"] = p.bubble;
  j["reduce_s"] = p.reduce_s;
  j["reduce_exposed_s"] = p.reduce_exposed_s;
  j["gather_s"] = p.gather_s;
  j["gather_exposed_s"] = p.gather_exposed_s;
  j["tp_comm_s"] = p.tp_comm_s;
  j["tp_sum_bytes"] = p.tp_sum_bytes;
  j["ep_comm_s"] = p.ep_comm_s;
  j["optimizer_s"] = p.optimizer_s;
  j["tokens_per_s"] = p.tokens_per_s;
  j["run_steps"] = spec.run.steps;
  j["wall_s"] = p.step_s * spec.run.steps;
  j["device_hours"] = p.step_s * spec.run.steps * world / 3600;
  j["memory_per_rank_bytes"] = plan.largest_memory_bytes(spec);
  if (memory_per_rank > 0) j["memory_capacity_bytes"] = memory_per_rank;
  return j;
}

std::string budget_text(const RunSpec& spec, const Plan& plan, const MachineCosts& costs, double memory_per_rank) {
  const StepPrediction p = predict_step(spec, costs);
  const int world = spec.parallel.tp * spec.parallel.pp * spec.parallel.dp;
  const char* device = spec.run.device == Device::gpu ? "GPU" : "rank";
  std::ostringstream os;
  os << "\ncost of a step and of the run (" << costs.source << "):\n";
  os << "  per step: " << human(p.flops, "FLOP") << " (model"
     << (spec.parallel.recompute == Recompute::none ? "" : " + recompute") << "), pipeline messages "
     << human(p.p2p_bytes, "B", 1024) << ", gradients all-reduced " << human(p.reduce_bytes, "B", 1024) << "\n";
  char figure[32];
  std::snprintf(figure, sizeof figure, "%.4f", p.bubble);
  os << "  predicted step " << duration(p.step_s) << " (forwards and backwards " << duration(p.pipeline_s)
     << ", bubble " << figure << "; reduction " << duration(p.reduce_s) << ", of it exposed "
     << duration(p.reduce_exposed_s) << "; agreement and update " << duration(p.optimizer_s)
     << "): " << human(p.tokens_per_s, "tokens/s") << ", "
     << human(p.flops / std::max(p.step_s, 1e-30) / world, "FLOP/s") << " per " << device << "\n";
  if (p.gather_s > 0)
    os << "  zero 3: layer gathers " << duration(p.gather_s) << " a step on the busiest rank, of it exposed "
       << duration(p.gather_exposed_s) << " (inside the forwards and backwards; "
       << (spec.parallel.reshards_after_forward() ? "gathered before every pass: reshard_after_forward"
                                                  : "each layer gathered once a step")
       << ")\n";
  if (spec.parallel.tp > 1)
    os << "  tensor group of " << spec.parallel.tp << ": exchanges of " << human(p.tp_sum_bytes, "B", 1024)
       << " activations (as each layer declares them) on the node's link, " << duration(p.tp_comm_s)
       << " a step on the busiest rank (inside the forwards and backwards)\n";
  if (p.ep_comm_s > 0)
    os << "  expert groups of " << spec.parallel.ep
       << ": all-to-alls of the MoE blocks' token rows (spread evenly over "
       << "the experts) on the link, " << duration(p.ep_comm_s)
       << " a step on the busiest rank (inside the forwards and backwards)\n";
  std::snprintf(figure, sizeof figure, "%.3g", p.step_s * spec.run.steps * world / 3600);
  os << "  run.steps = " << spec.run.steps << ": " << duration(p.step_s * spec.run.steps) << " wall, " << figure << " "
     << device << "-hours on " << world << " " << device << (world > 1 ? "s" : "") << "\n";
  const double need = plan.largest_memory_bytes(spec);
  os << "  memory per " << device << ": " << human(need, "B", 1024) << " on the fullest";
  if (memory_per_rank > 0)
    os << " of " << human(memory_per_rank, "B", 1024) << (need <= memory_per_rank ? " (fits)" : " (DOES NOT FIT)");
  os << "\n";
  return os.str();
}

std::optional<ImbalanceWarning> imbalance_warning(const RunSpec& spec, const Plan& plan) {
  const double excess = plan.bubble_sim - plan.bubble_theory;
  if (excess < 0.1 || plan.bubble_sim < 2 * plan.bubble_theory) return std::nullopt;
  const std::vector<int> blocks = partition_blocks(spec);
  const std::vector<double> costs = stage_costs(spec, blocks);
  double total = 0;
  size_t heaviest = 0;
  for (size_t v = 0; v < costs.size(); ++v) {
    total += costs[v];
    if (costs[v] > costs[heaviest]) heaviest = v;
  }
  const ChunkPlacement place = spec.chunk_placement();
  char line[400];
  std::snprintf(line, sizeof line,
                "the simulated bubble %.3f is far above %s's %.3f with even stages: %s %zu (rank %d, %d "
                "block%s%s) does %.0f%% of the work where an even share is %.0f%%",
                plan.bubble_sim, spec.parallel.schedule->name.c_str(), plan.bubble_theory,
                place.chunks > 1 ? "chunk" : "stage", heaviest, place.stage_of(heaviest), blocks[heaviest],
                blocks[heaviest] == 1 ? "" : "s",
                heaviest + 1 == costs.size() ? " + the LM head"
                : heaviest == 0              ? " + the embedding"
                                             : "",
                100 * costs[heaviest] / total, 100.0 / costs.size());
  ImbalanceWarning warning{line, ""};
  // Candidate fixes, judged by the simulated step (bubble and work together): a balanced partition,
  // and other chunk counts of the same schedule or plain 1f1b.
  struct Fix {
    std::string sets;
    RunSpec spec;
  };
  std::vector<Fix> fixes;
  auto add = [&](std::string sets, RunSpec s) {
    if (!layout_problem(*s.parallel.schedule, s.pipeline_shape())) fixes.push_back({std::move(sets), std::move(s)});
  };
  RunSpec balanced = spec;
  balanced.parallel.partition = Partition::balanced;
  if (spec.parallel.partition != Partition::balanced) add("--set parallel.partition=balanced", balanced);
  if (spec.parallel.schedule->chunked && spec.parallel.schedule->placement == Placement::loop)
    for (int V = 1; V <= 4; ++V) {
      if (V == spec.parallel.virtual_stages) continue;
      RunSpec s = balanced;
      s.parallel.virtual_stages = V;
      if (V == 1) s.parallel.schedule = &schedule_named("1f1b");
      add(std::string(V == 1 ? "--set parallel.schedule=1f1b " : "") +
              "--set parallel.virtual_stages=" + std::to_string(V) + " --set parallel.partition=balanced",
          s);
    }
  const double now = plan.step_units;
  const Fix* best = nullptr;
  double best_units = now, best_bubble = plan.bubble_sim;
  for (const Fix& f : fixes) {
    const Plan p = make_plan(f.spec);
    if (p.step_units < best_units * 0.99) {
      best = &f;
      best_units = p.step_units;
      best_bubble = p.bubble_sim;
    }
  }
  if (best) {
    std::snprintf(line, sizeof line, "try %s: simulated bubble %.3f, step %.0f%% of this layout's", best->sets.c_str(),
                  best_bubble, 100 * best_units / now);
    warning.advice = line;
  } else {
    warning.advice =
        "no other partition or chunk count of this schedule simulates a shorter step; fewer stages would lower the "
        "bubble";
  }
  return warning;
}

}  // namespace pipetrain
