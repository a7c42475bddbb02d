#include "pipetrain/planner/step_time.hpp"

#include <algorithm>

#include "pipetrain/model/model.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

StepPrediction predict_step(const RunSpec& spec, const MachineCosts& costs) {
  const auto& par = spec.parallel;
  const ScheduleKind& schedule = *par.schedule;
  const ChunkPlacement place = spec.chunk_placement();
  const int P = par.pp, D = par.dp, M = par.micro_batches, n_virtual = place.virtual_stages();
  const int b = spec.samples_per_micro_batch();
  const std::vector<int> blocks = partition_blocks(spec);
  const PassCosts block = costs.block_under(par.recompute, b), embed = costs.embed(b), head = costs.head(b);
  // Each virtual stage's passes (under recompute a block's backward re-runs its forward).
  std::vector<double> fwd, bwd, wgt;
  for (int v = 0; v < n_virtual; ++v) {
    const PassCosts c = stage_passes(block, embed, head, blocks[v], v == 0, v == n_virtual - 1);
    fwd.push_back(c.f);
    bwd.push_back(c.backward());
    wgt.push_back(c.w);
  }
  std::vector<ActionList> lists;
  for (int s = 0; s < P; ++s) lists.push_back(schedule.generate(s, spec.pipeline_shape()));
  const double boundary_bytes = sizeof(float) * static_cast<double>(b) * spec.model.seq_len * spec.model.d_model;
  const SimResult sim = simulate(lists, fwd, bwd, wgt, place.kind, costs.p2p_s(boundary_bytes));

  StepPrediction r;
  r.pipeline_s = sim.makespan;
  const bool tied_apart = spec.model.tie_embeddings && place.head_stage() != 0;
  const double tied_bytes = sizeof(float) * static_cast<double>(spec.model.vocab) * spec.model.d_model;
  std::vector<double> working(P);  // per stage: computing, reducing gradients, updating
  for (int s = 0; s < P; ++s) {
    double params = 0;
    for (const ParamTensor& t : rank_params(spec, chunks_of(blocks, place, s), n_virtual)) params += t.size;
    const double finish = sim.spans[s].empty() ? 0 : sim.spans[s].back().end;
    // ZeRO-1's reduce-scatter and all-gather move what one all-reduce moves.
    double reduce = costs.allreduce_s(sizeof(float) * params, D);
    if (tied_apart && (s == 0 || s == place.head_stage())) reduce += costs.allreduce_s(tied_bytes, 2);
    // The step agreement (norm, stop, finite: three doubles over every rank), then the update.
    const double optim = costs.allreduce_s(3 * sizeof(double), P * D) + costs.adamw_s(par.zero ? params / D : params);
    working[s] = sim.busy[s] + reduce + optim;
    if (finish + reduce + optim > r.step_s) {
      r.step_s = finish + reduce + optim;
      r.reduce_s = reduce;
      r.optimizer_s = optim;
    }
    if (D > 1) r.reduce_bytes += D * sizeof(float) * params;
  }
  // As metrics' bubble_measured counts it: the share of the step a rank waits for others, in the
  // pipeline and at the step's end for the slowest rank (the gradient reduction is work).
  for (int s = 0; s < P; ++s) r.bubble += r.step_s > 0 ? (1 - working[s] / r.step_s) / P : 0;
  const double tokens = static_cast<double>(spec.train.global_batch) * spec.model.seq_len;
  r.tokens_per_s = r.step_s > 0 ? tokens / r.step_s : 0;
  // As training_flops_per_token counts them, plus recompute's second forward of every block.
  const double C = spec.model.d_model, T = spec.model.seq_len;
  const double block_forward = 2 * block_weight_macs(block_shape(spec)) + 4 * T * C;
  r.flops = tokens * (training_flops_per_token(spec) +
                      (par.recompute == Recompute::none ? 0 : spec.model.n_layer * block_forward));
  // Every boundary between virtual stages on different ranks carries an activation and a gradient
  // per micro-batch, in every replica.
  for (int v = 0; v + 1 < n_virtual; ++v)
    if (place.stage_of(v) != place.stage_of(v + 1)) r.p2p_bytes += 2.0 * M * D * boundary_bytes;
  return r;
}

}  // namespace pipetrain
