#include "pipetrain/planner/plan.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optimizer_shard.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/util/files.hpp"

namespace pipetrain {
namespace {

constexpr Recompute kModes[3] = {Recompute::none, Recompute::stage, Recompute::block};

// The most floats of whole weights a ZeRO-3 rank holds at once when every layer is released after
// its pass: a layer and the next, gathered ahead (buffer order is a forward's order).
size_t two_layers_floats(const std::vector<ParamTensor>& params) {
  std::vector<size_t> layers;  // per layer: embedding, each block, head
  std::string last;
  for (const ParamTensor& t : params) {
    const bool block = t.name.rfind("h.", 0) == 0;
    const bool embedding = t.name == "wpe.weight" || (t.name == "wte.weight" && !t.tied_copy);
    const std::string layer = block ? t.name.substr(0, t.name.find('.', 2)) : embedding ? "embedding" : "head";
    if (layers.empty() || layer != last) layers.push_back(0);
    layers.back() += t.size;
    last = layer;
  }
  size_t most = layers.empty() ? 0 : layers[0];
  for (size_t i = 1; i < layers.size(); ++i) most = std::max(most, layers[i - 1] + layers[i]);
  return most;
}

// parallel.zero as it acts: with one replica nothing is sharded.
int acting_zero(const RunSpec& spec) { return spec.parallel.dp > 1 ? spec.parallel.zero : 0; }

}  // namespace

StagePlan::State StagePlan::state_at(int zero, bool reshard) const {
  const double P = params, S = shard_floats;
  State s;
  s.weights_held = 4 * (zero >= 3 ? S : P);
  s.weights = zero >= 3 ? 4 * (S + (reshard ? layer_floats : P)) : 4 * P;
  s.grads_held = 4 * (zero >= 2 ? S : P);
  s.grads = zero >= 2 ? 4 * (S + (accumulates ? P : layer_floats)) : 4 * P;
  s.optim = 8 * (zero >= 1 ? S : P);
  s.startup = 4 * (P + (zero >= 3 ? S : 0));
  return s;
}

double StagePlan::state_bytes(const RunSpec& spec) const {
  return state_at(acting_zero(spec), spec.parallel.reshards_after_forward()).total() +
         (spec.checkpoint.async ? snapshot_bytes : 0);
}

double StagePlan::memory_bytes(const RunSpec& spec) const {
  const double training = state_bytes(spec) + act_held_bytes[static_cast<int>(spec.parallel.recompute)] +
                          working_bytes + reduce_scratch_bytes;
  return std::max(training, state_at(acting_zero(spec), spec.parallel.reshards_after_forward()).startup);
}

double Plan::largest_memory_bytes(const RunSpec& spec) const {
  double need = 0;
  for (const StagePlan& s : stages) need = std::max(need, s.memory_bytes(spec));
  return need;
}

std::string schedule_description(const RunSpec& spec) {
  const int V = spec.parallel.virtual_stages;
  return spec.parallel.schedule->name + (V > 1 ? " (" + std::to_string(V) + " chunks per stage)" : "");
}

Plan make_plan(const RunSpec& spec) {
  const int P = spec.parallel.pp, V = spec.parallel.virtual_stages;
  const ScheduleKind& schedule = *spec.parallel.schedule;
  const std::vector<int> blocks = partition_blocks(spec);       // per virtual stage
  const std::vector<double> costs = stage_costs(spec, blocks);  // forward + backward per token
  double total = 0;
  for (double c : costs) total += c;
  std::vector<ActionList> lists;
  for (int s = 0; s < P; ++s) lists.push_back(schedule.generate(s, spec.pipeline_shape()));

  // Backward costs twice the forward; recompute re-runs the forward inside the backward.
  const bool recompute = spec.parallel.recompute != Recompute::none;
  std::vector<double> fwd, bwd;
  for (double c : costs) {
    fwd.push_back(c / 3);
    bwd.push_back(2 * c / 3 + (recompute ? c / 3 : 0));
  }
  const SimResult sim = simulate(lists, fwd, bwd, {}, schedule.placement);
  // The classic GPipe chart gives a forward and a backward one slot each; a chart of a schedule
  // that splits the backward gives its B and its W one slot each.
  const std::vector<double> unit(P * V, 1.0), unit_bwd(P * V, schedule.splits_backward ? 2.0 : 1.0);

  Plan plan;
  plan.world = spec.parallel.tp * P * spec.parallel.dp;
  plan.bubble_theory = schedule.bubble(spec.pipeline_shape());
  plan.bubble_sim = sim.mean_bubble();
  plan.step_units = sim.makespan;
  plan.chart = render_chart(simulate(lists, unit, unit_bwd, {}, schedule.placement));
  for (int s = 0; s < P; ++s) {
    const std::vector<ChunkRange> chunks = chunks_of(blocks, spec.chunk_placement(), s);
    StagePlan sp;
    // Per rank of the tensor group: its parts, the last rank's (which holds the most vocabulary rows),
    // and of an expert group its experts (as many on each).
    const std::vector<ParamTensor> params =
        rank_params(spec, chunks, P * V, TpPart{spec.parallel.tp - 1, spec.parallel.tp}, TpPart{0, spec.parallel.ep});
    for (auto& t : params) sp.params += t.size;
    sp.shard_floats = OptimizerShard::max_state_floats(params, spec.parallel.dp, spec.parallel.ep);
    sp.layer_floats = two_layers_floats(params);
    sp.accumulates = spec.parallel.micro_batches > 1;
    // A replica saves the same row slab of every tensor it would own under ZeRO-1 (tied copies aside).
    std::vector<ParamTensor> saved;
    for (auto& t : params)
      if (!t.tied_copy) saved.push_back(t);
    sp.snapshot_bytes = 12 * OptimizerShard::max_state_floats(saved, spec.parallel.dp, spec.parallel.ep);
    std::vector<size_t> wgrads;
    std::vector<std::vector<size_t>> stash(3);  // per recompute mode, per chunk
    for (const ChunkRange& c : chunks) {
      const int n = c.block_end - c.block_begin;
      sp.blocks += n;
      sp.cost_share += costs[c.vstage] / total;
      const BlockSpan span{c.block_begin, c.block_end};
      wgrads.push_back(wgrad_bytes_per_micro_batch(spec, c.vstage, P * V, span));
      for (int m = 0; m < 3; ++m)
        stash[m].push_back(stash_bytes_per_micro_batch(spec, c.vstage, P * V, span, kModes[m]));
    }
    sp.bubble = sim.bubble[s];
    sp.in_flight = max_in_flight(lists[s]);
    const std::vector<int> pools = buffer_pools(chunks, P * V);
    for (int m = 0; m < 3; ++m) {
      sp.act_peak_bytes[m] = peak_activation_bytes(lists[s], stash[m], wgrads);
      sp.act_held_bytes[m] = held_activation_bytes(lists[s], stash[m], wgrads, pools);
    }
    sp.working_bytes = working_bytes(spec, chunks, P * V);
    // Under bf16 on the CPU, the products' copy of the rank's whole weights, 2 bytes each, kept from
    // step to step (Bf16WeightScope); ZeRO-3's gathered layers are rounded product by product.
    if (spec.model.dtype == Dtype::bf16 && spec.run.device == Device::cpu && acting_zero(spec) < 3)
      sp.working_bytes += 2 * sp.params;
    const size_t D = spec.parallel.dp;
    // MPI's scratch for the replicas' gradient sums: unsharded, the all-reduce buckets', (D - 1) / D of the
    // gradients; sharded, a part (1 / D) of each travelling reduce-scatter, of at most the window.
    const size_t travelling = std::min(sp.params, OptimizerShard::reduce_window(params, spec.comm.bucket_floats()));
    sp.reduce_scratch_bytes = spec.parallel.zero == 0 ? sizeof(float) * sp.params * (D - 1) / D
                              : D > 1                 ? sizeof(float) * travelling / D
                                                      : 0;
    plan.stages.push_back(sp);
  }
  return plan;
}

namespace {

// A mixture of experts' parameters: all of them, those a token passes through (the router, its
// top_k experts, the shared experts, everything outside the MoE blocks' experts), the experts'.
// Under expert parallelism, the bytes a rank's all-to-alls send other ranks per micro-batch and
// MoE block, when the router spreads the rows evenly: each of its N top_k rows of d_model floats
// goes out and back in the forward, and its gradient out, its input again out and its gradient
// back in the backward, (ep - 1) / ep of them to other ranks.
struct MoeParams {
  double total = 0, active = 0, experts = 0;
  int moe_blocks = 0;
  double all_to_all_bytes = 0;
};
MoeParams moe_params(const RunSpec& spec) {
  MoeParams m;
  for (const ParamTensor& t : stage_params(spec, 0, 1, 0, spec.model.n_layer)) m.total += t.size;
  const auto& moe = spec.model.moe;
  if (!moe.on()) return m;
  m.moe_blocks = block_kinds(spec, {0, spec.model.n_layer}).moe;
  const BlockShape s = block_shape(spec, moe.every - 1);
  const double per_expert = 3.0 * s.ffn * s.C;  // gate, up, down
  m.experts = m.moe_blocks * moe.experts * per_expert;
  m.active = m.total - m.moe_blocks * (moe.experts - moe.top_k) * per_expert;
  const int ep = spec.parallel.ep;
  m.all_to_all_bytes = 5.0 * micro_batch_rows(spec).tokens * moe.top_k * s.C * sizeof(float) * (ep - 1) / ep;
  return m;
}

// "674 k", "6.92 B": a parameter count.
std::string count_text(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.3g B", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.3g M", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%.3g k", n / 1e3);
  return buf;
}

std::string moe_text(const RunSpec& spec) {
  const auto& moe = spec.model.moe;
  if (!moe.on()) return "";
  const MoeParams m = moe_params(spec);
  const int ep = spec.parallel.ep;
  char where[256];
  if (ep == 1)
    std::snprintf(where, sizeof where, "the experts' %s on every data-parallel rank", count_text(m.experts).c_str());
  else
    std::snprintf(where, sizeof where,
                  "the experts' %s spread over ep = %d replicas (%d experts, %s on each), each MoE block's "
                  "all-to-alls sending other ranks %.3g %s per micro-batch",
                  count_text(m.experts).c_str(), ep, moe.experts / ep, count_text(m.experts / ep).c_str(),
                  m.all_to_all_bytes >= 1e9 ? m.all_to_all_bytes / 1e9 : m.all_to_all_bytes / 1e6,
                  m.all_to_all_bytes >= 1e9 ? "GB" : "MB");
  char line[768];
  std::snprintf(line, sizeof line,
                "\nmixture of experts: %d experts of SwiGLU %d in %d of %d blocks, each token to %d%s: %s "
                "parameters, %s active per token (%.0f%%); %s. Activations, FLOPs and all-to-alls count a "
                "micro-batch's %d expert rows (tokens x top_k) spread evenly over the experts (an expert "
                "rank that receives more holds more; a capacity only lowers them).\n",
                moe.experts, block_shape(spec, moe.every - 1).ffn, m.moe_blocks, spec.model.n_layer, moe.top_k,
                moe.shared_experts ? (" + " + std::to_string(moe.shared_experts) + " shared").c_str() : "",
                count_text(m.total).c_str(), count_text(m.active).c_str(), 100 * m.active / m.total, where,
                static_cast<int>(micro_batch_rows(spec).tokens * moe.top_k));
  return line;
}

}  // namespace

std::string plan_text(const RunSpec& spec, const Plan& plan) {
  const auto& p = spec.parallel;
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line,
                "plan: %d ranks = %s%s | M=%d micro-batches of %d samples x %d tokens | schedule %s | recompute %s\n",
                plan.world, grid_text(p.tp, p.pp, p.dp).c_str(), p.sequence_parallel ? ", sequence parallel" : "",
                p.micro_batches, spec.samples_per_micro_batch(), spec.model.seq_len, schedule_description(spec).c_str(),
                name_of(p.recompute));
  os << line << moe_text(spec) << "\npartition (" << name_of(p.partition) << "):\n"
     << describe_partition(spec, partition_blocks(spec));
  os << "\nschedule, " << p.schedule->chart_caption << ":\n";
  if (plan.chart.empty()) os << "  (too wide to draw; lower M to see it)\n";
  else os << plan.chart;
  std::snprintf(line, sizeof line,
                "\nbubble: %s = %.4f | simulated with per-stage costs (backward = 2 x forward%s) = %.4f\n",
                p.schedule->bubble_formula.c_str(), plan.bubble_theory,
                p.recompute == Recompute::none ? "" : " + recompute", plan.bubble_sim);
  os << line << "  per stage:";
  for (auto& s : plan.stages) {
    std::snprintf(line, sizeof line, " %.4f", s.bubble);
    os << line;
  }
  os << "\n\nmemory per stage (activations of the micro-batches in flight at the schedule's peak, by recompute\n"
        "mode; "
     << p.schedule->name << " keeps" << (p.virtual_stages > 1 ? " (chunk-micro-batches)" : "");
  for (size_t s = 0; s < plan.stages.size(); ++s) os << (s ? ", " : " ") << plan.stages[s].in_flight;
  os << "; working: scratch and buffers under recompute = " << name_of(p.recompute)
     << (p.dp > 1 ? ", and MPI's for the gradient reduction" : "") << "):\n";
  // Weights, gradients and AdamW at the spec's zero, then the three together at each level over this
  // layout's dp (the spec's marked).
  const int zero = acting_zero(spec);
  const bool reshard = p.reshards_after_forward();
  std::string levels[4];
  for (int z = 0; z < 4; ++z) levels[z] = std::string(z == p.zero ? "*" : "") + "zero " + std::to_string(z);
  std::snprintf(line, sizeof line, "  %-6s %10s %10s %10s | %9s %9s %9s %9s | %10s %10s %10s | %10s\n", "stage",
                "weights", "grads", "AdamW", levels[0].c_str(), levels[1].c_str(), levels[2].c_str(), levels[3].c_str(),
                "act none", "act stage", "act block", "working");
  os << line;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const auto& sp = plan.stages[s];
    const StagePlan::State mine = sp.state_at(zero, reshard);
    double by_level[4];
    for (int z = 0; z < 4; ++z) by_level[z] = sp.state_at(p.dp > 1 ? z : 0, reshard).total();
    std::snprintf(line, sizeof line, "  %-6zu %10s %10s %10s | %9s %9s %9s %9s | %10s %10s %10s | %10s\n", s,
                  human_bytes(mine.weights).c_str(), human_bytes(mine.grads).c_str(), human_bytes(mine.optim).c_str(),
                  human_bytes(by_level[0]).c_str(), human_bytes(by_level[1]).c_str(), human_bytes(by_level[2]).c_str(),
                  human_bytes(by_level[3]).c_str(), human_bytes(sp.act_peak_bytes[0]).c_str(),
                  human_bytes(sp.act_peak_bytes[1]).c_str(), human_bytes(sp.act_peak_bytes[2]).c_str(),
                  human_bytes(sp.working_bytes + sp.reduce_scratch_bytes).c_str());
    os << line;
  }
  os << "  (weights, grads, AdamW: at the step's peak under the spec's parallel.zero (*); zero 1 keeps each replica's "
        "AdamW state\n   for its row slab of every tensor over dp "
     << p.dp
     << ", 2 also the summed gradient (whole only while a step accumulates it), 3 also the weights\n   (whole only "
     << (reshard ? "for the layer a pass reads and the next: reshard_after_forward)"
                 : "from a step's first forward to its end)")
     << "\n";
  if (spec.checkpoint.async) {
    os << "  checkpoint.async: each save's host snapshot (the replica's slab of weights and moments):";
    for (auto& sp : plan.stages) os << " " << human_bytes(sp.snapshot_bytes);
    os << "\n";
  }
  return os.str();
}

std::string schedule_comparison(const RunSpec& spec) {
  std::ostringstream os;
  const int mode = static_cast<int>(spec.parallel.recompute);
  const int V = std::max(2, spec.parallel.virtual_stages);
  os << "schedules for pp " << spec.parallel.pp << ", M=" << spec.parallel.micro_batches << ", recompute "
     << name_of(spec.parallel.recompute) << " (bubble with even stages | simulated with the cost model); chunked "
     << "schedules (" << V << " chunks per stage, a V of 2) hold chunk-micro-batches:\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-11s %8s %10s   %-24s %s\n", "", "bubble", "simulated", "held per stage",
                "activation peak (largest stage)");
  os << line;
  for (const ScheduleKind* kind : all_schedules()) {
    const std::string& name = kind->name;
    RunSpec s = spec;
    s.parallel.schedule = kind;
    s.parallel.virtual_stages = !kind->chunked ? 1 : kind->placement == Placement::vee ? 2 : V;
    if (s.parallel.partition == Partition::explicit_list && s.parallel.virtual_stages != spec.parallel.virtual_stages)
      s.parallel.partition = Partition::uniform;  // the explicit list has one entry per chunk of the spec's layout
    const LayoutProblem unfit = kind->splits_backward && s.parallel.recompute != Recompute::none
                                    ? LayoutProblem{"parallel.recompute", "needs recompute = none"}
                                    : layout_problem(*kind, s.pipeline_shape());
    if (unfit) {
      std::snprintf(line, sizeof line, "  %-11s (%s: %s)\n", name.c_str(), unfit.key.c_str(), unfit.why.c_str());
      os << line;
      continue;
    }
    const Plan p = make_plan(s);
    std::string held;
    size_t peak = 0;
    for (auto& st : p.stages) {
      held += (held.empty() ? "" : " ") + std::to_string(st.in_flight);
      peak = std::max(peak, st.act_peak_bytes[mode]);
    }
    std::snprintf(line, sizeof line, "  %-11s %8.4f %10.4f   %-24s %s\n", name.c_str(), p.bubble_theory, p.bubble_sim,
                  held.c_str(), human_bytes(peak).c_str());
    os << line;
  }
  return os.str();
}

nlohmann::json plan_json(const RunSpec& spec, const Plan& plan) {
  nlohmann::json j;
  j["world"] = plan.world;
  j["tp"] = spec.parallel.tp;
  j["pp"] = spec.parallel.pp;
  j["dp"] = spec.parallel.dp;
  j["micro_batches"] = spec.parallel.micro_batches;
  j["virtual_stages"] = spec.parallel.virtual_stages;
  j["partition"] = partition_blocks(spec);  // blocks per virtual stage
  j["bubble_theory"] = plan.bubble_theory;
  j["bubble_sim"] = plan.bubble_sim;
  if (spec.model.moe.on()) {
    const MoeParams m = moe_params(spec);
    j["moe"] = {{"experts", spec.model.moe.experts},
                {"top_k", spec.model.moe.top_k},
                {"moe_blocks", m.moe_blocks},
                {"params", m.total},
                {"active_params", m.active},
                {"expert_params", m.experts},
                {"ep", spec.parallel.ep},
                {"all_to_all_bytes_per_micro_batch", m.all_to_all_bytes}};
  }
  j["stages"] = nlohmann::json::array();
  for (auto& s : plan.stages) {
    const StagePlan::State state = s.state_at(acting_zero(spec), spec.parallel.reshards_after_forward());
    nlohmann::json by_zero, state_by_zero, held_by_zero;  // at each level over this dp
    for (int z = 0; z < 4; ++z) {
      const StagePlan::State at = s.state_at(spec.parallel.dp > 1 ? z : 0, spec.parallel.reshards_after_forward());
      by_zero.push_back(at.optim);
      state_by_zero.push_back(at.total());
      held_by_zero.push_back(at.held());
    }
    nlohmann::json act, held;
    for (int m = 0; m < 3; ++m) {
      act[name_of(kModes[m])] = s.act_peak_bytes[m];
      held[name_of(kModes[m])] = s.act_held_bytes[m];
    }
    j["stages"].push_back({{"blocks", s.blocks},
                           {"params", s.params},
                           {"param_bytes", state.weights},
                           {"grad_bytes", state.grads},
                           {"optim_bytes", state.optim},
                           {"param_bytes_held", state.weights_held},
                           {"grad_bytes_held", state.grads_held},
                           {"optim_bytes_by_zero", by_zero},
                           {"state_bytes_by_zero", state_by_zero},
                           {"state_bytes_held_by_zero", held_by_zero},
                           {"snapshot_bytes", spec.checkpoint.async ? s.snapshot_bytes : 0},
                           {"cost_share", s.cost_share},
                           {"bubble_sim", s.bubble},
                           {"in_flight", s.in_flight},
                           {"act_peak_bytes", act},
                           {"act_held_bytes", held},
                           {"working_bytes", s.working_bytes},
                           {"reduce_scratch_bytes", s.reduce_scratch_bytes},
                           {"memory_bytes", s.memory_bytes(spec)}});
  }
  return j;
}

}  // namespace pipetrain
