#include "pipetrain/pipeline/plan.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipetrain/model/model.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/pipeline/schedule.hpp"

namespace pipetrain {
namespace {

constexpr Recompute kModes[3] = {Recompute::none, Recompute::stage, Recompute::block};
constexpr const char* kModeNames[3] = {"none", "stage", "block"};

std::string bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  for (; b >= 1024 && u < 4; ++u) b /= 1024;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

}  // namespace

Plan make_plan(const RunSpec& spec) {
  const int P = spec.parallel.pp, M = spec.parallel.micro_batches, V = spec.parallel.virtual_stages;
  const std::vector<int> blocks = partition_blocks(spec);       // per virtual stage
  const std::vector<double> costs = stage_costs(spec, blocks);  // forward + backward per token
  double total = 0;
  for (double c : costs) total += c;
  std::vector<ActionList> lists;
  for (int s = 0; s < P; ++s) lists.push_back(make_schedule(spec.parallel.schedule, s, P, M, V));

  // Backward costs twice the forward; recompute re-runs the forward inside the backward.
  const bool recompute = parse_recompute(spec.parallel.recompute) != Recompute::none;
  std::vector<double> fwd, bwd;
  for (double c : costs) fwd.push_back(c / 3), bwd.push_back(2 * c / 3 + (recompute ? c / 3 : 0));
  const SimResult sim = simulate(lists, fwd, bwd);
  // The seed's charts give a forward and a backward one slot each; zero-bubble charts give B and
  // W one slot each.
  const bool split = spec.parallel.schedule == "zb-h1";
  const std::vector<double> unit(P * V, 1.0), unit_bwd(P * V, split ? 2.0 : 1.0);

  Plan plan;
  plan.world = P * spec.parallel.dp;
  plan.bubble_theory = schedule_bubble(spec.parallel.schedule, P, M, V);
  plan.bubble_sim = sim.mean_bubble();
  plan.chart = render_chart(simulate(lists, unit, unit_bwd));
  for (int s = 0; s < P; ++s) {
    const std::vector<ChunkRange> chunks = chunks_of(blocks, P, s);
    StagePlan sp;
    for (auto& t : rank_params(spec, chunks, P * V)) sp.params += t.size;
    std::vector<size_t> wgrads;
    std::vector<std::vector<size_t>> stash(3);  // per recompute mode, per chunk
    for (const ChunkRange& c : chunks) {
      const int n = c.block_end - c.block_begin;
      sp.blocks += n;
      sp.cost_share += costs[c.vstage] / total;
      wgrads.push_back(wgrad_bytes_per_micro_batch(spec, c.vstage, P * V, n));
      for (int m = 0; m < 3; ++m) stash[m].push_back(stash_bytes_per_micro_batch(spec, c.vstage, P * V, n, kModes[m]));
    }
    sp.bubble = sim.bubble[s];
    sp.in_flight = max_in_flight(lists[s]);
    for (int m = 0; m < 3; ++m) sp.act_peak_bytes[m] = peak_activation_bytes(lists[s], stash[m], wgrads);
    sp.working_bytes = working_bytes(spec, chunks, P * V);
    plan.stages.push_back(sp);
  }
  return plan;
}

std::string plan_text(const RunSpec& spec, const Plan& plan) {
  const auto& p = spec.parallel;
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line,
                "plan: %d ranks = pp %d x dp %d | M=%d micro-batches of %d samples x %d tokens | schedule %s | "
                "recompute %s\n",
                plan.world, p.pp, p.dp, p.micro_batches, spec.samples_per_micro_batch(), spec.model.seq_len,
                (p.schedule + (p.virtual_stages > 1 ? " (" + std::to_string(p.virtual_stages) + " chunks per stage)" : ""))
                    .c_str(),
                p.recompute.c_str());
  os << line << "\npartition (" << p.partition << "):\n" << describe_partition(spec, partition_blocks(spec));
  os << (p.schedule == "zb-h1"         ? "\nschedule, one slot per forward, input-gradient (B) or weight-gradient (W) pass:\n"
         : p.schedule == "interleaved" ? "\nschedule, one slot per chunk's forward or backward (F3.1: micro-batch 3 through the "
                                         "stage's chunk 1; chunk 0 unmarked):\n"
                                       : "\nschedule, one slot per forward or backward (T_f = T_b, as in the seed's diagrams):\n");
  if (plan.chart.empty()) os << "  (too wide to draw; lower M to see it)\n";
  else os << plan.chart;
  std::snprintf(line, sizeof line,
                "\nbubble: %s = %.4f | simulated with per-stage costs (backward = 2 x forward%s) = %.4f\n",
                p.schedule == "zb-h1"         ? "with F = B = W"
                : p.schedule == "interleaved" ? "closed form (P-1)/(VM+P-1)"
                                              : "closed form (P-1)/(M+P-1)",
                plan.bubble_theory,
                p.recompute == "none" ? "" : " + recompute", plan.bubble_sim);
  os << line << "  per stage:";
  for (auto& s : plan.stages) std::snprintf(line, sizeof line, " %.4f", s.bubble), os << line;
  os << "\n\nmemory per stage (activations of the micro-batches in flight at the schedule's peak, by recompute\n"
        "mode; " << p.schedule << " keeps" << (p.virtual_stages > 1 ? " (chunk-micro-batches)" : "");
  for (size_t s = 0; s < plan.stages.size(); ++s) os << (s ? ", " : " ") << plan.stages[s].in_flight;
  os << "; working: scratch and buffers under recompute = " << p.recompute << "):\n";
  std::snprintf(line, sizeof line, "  %-8s %12s %12s %12s | %12s %12s %12s | %12s\n", "stage", "params", "grads",
                "AdamW", "act none", "act stage", "act block", "working");
  os << line;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const auto& sp = plan.stages[s];
    std::snprintf(line, sizeof line, "  %-8zu %12s %12s %12s | %12s %12s %12s | %12s\n", s,
                  bytes(4.0 * sp.params).c_str(), bytes(4.0 * sp.params).c_str(), bytes(8.0 * sp.params).c_str(),
                  bytes(sp.act_peak_bytes[0]).c_str(), bytes(sp.act_peak_bytes[1]).c_str(),
                  bytes(sp.act_peak_bytes[2]).c_str(), bytes(sp.working_bytes).c_str());
    os << line;
  }
  return os.str();
}

std::string schedule_comparison(const RunSpec& spec) {
  std::ostringstream os;
  const int mode = static_cast<int>(parse_recompute(spec.parallel.recompute));
  const int V = std::max(2, spec.parallel.virtual_stages);
  os << "schedules for pp " << spec.parallel.pp << ", M=" << spec.parallel.micro_batches << ", recompute "
     << spec.parallel.recompute << " (bubble with even stages | simulated with the cost model); interleaved with "
     << V << " chunks per stage, holding chunk-micro-batches:\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-11s %8s %10s   %-24s %s\n", "", "bubble", "simulated", "held per stage",
                "activation peak (largest stage)");
  os << line;
  const int P = spec.parallel.pp;
  for (const std::string name : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
    RunSpec s = spec;
    s.parallel.schedule = name;
    s.parallel.virtual_stages = name == "interleaved" ? V : 1;
    if (s.parallel.partition == "explicit" && s.parallel.virtual_stages != spec.parallel.virtual_stages)
      s.parallel.partition = "uniform";  // the explicit list has one entry per chunk of the spec's layout
    const char* unfit = name == "zb-h1" && mode != 0                               ? "needs recompute = none"
                        : name == "interleaved" && P < 2                            ? "needs pp >= 2"
                        : name == "interleaved" && spec.parallel.micro_batches % P ? "needs M a multiple of pp"
                        : name == "interleaved" && P * V > spec.model.n_layer       ? "needs n_layer >= pp x V"
                                                                                    : nullptr;
    if (unfit) {
      std::snprintf(line, sizeof line, "  %-11s (%s)\n", name.c_str(), unfit);
      os << line;
      continue;
    }
    const Plan p = make_plan(s);
    std::string held;
    size_t peak = 0;
    for (auto& st : p.stages) held += (held.empty() ? "" : " ") + std::to_string(st.in_flight), peak = std::max(peak, st.act_peak_bytes[mode]);
    std::snprintf(line, sizeof line, "  %-11s %8.4f %10.4f   %-24s %s\n", name.c_str(), p.bubble_theory, p.bubble_sim,
                  held.c_str(), bytes(peak).c_str());
    os << line;
  }
  return os.str();
}

std::string plan_json(const RunSpec& spec, const Plan& plan) {
  nlohmann::json j;
  j["world"] = plan.world;
  j["pp"] = spec.parallel.pp;
  j["dp"] = spec.parallel.dp;
  j["micro_batches"] = spec.parallel.micro_batches;
  j["virtual_stages"] = spec.parallel.virtual_stages;
  j["partition"] = partition_blocks(spec);  // blocks per virtual stage
  j["bubble_theory"] = plan.bubble_theory;
  j["bubble_sim"] = plan.bubble_sim;
  j["stages"] = nlohmann::json::array();
  for (auto& s : plan.stages) {
    nlohmann::json act;
    for (int m = 0; m < 3; ++m) act[kModeNames[m]] = s.act_peak_bytes[m];
    j["stages"].push_back({{"blocks", s.blocks}, {"params", s.params}, {"param_bytes", 4 * s.params},
                           {"grad_bytes", 4 * s.params}, {"optim_bytes", 8 * s.params}, {"cost_share", s.cost_share},
                           {"bubble_sim", s.bubble}, {"in_flight", s.in_flight}, {"act_peak_bytes", act},
                           {"working_bytes", s.working_bytes}});
  }
  return j.dump(2) + "\n";
}

}  // namespace pipetrain
