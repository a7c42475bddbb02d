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
  // On a tensor rank each pass computes a TP-th of its products and sums a micro-batch's activation
  // (tokens x d_model floats) over the tensor group: a block's forward twice, its input-gradient
  // pass twice (a recomputing backward the forward's two again), the embedding's forward and the
  // head's backward once (the loss's statistics are a few floats a token). With sequence
  // parallelism a sum is a reduce-scatter and an all-gather, which move what an all-reduce moves;
  // the backward gathers the norms' outputs again (one sum's worth a block, in the weight pass
  // when it runs apart; the head's forward and backward half of one each), and a pipeline message
  // carries a TP-th of the activation.
  const int TP = par.tp;
  const bool sp = par.sequence_parallel && TP > 1;
  const double activation_bytes = sizeof(float) * static_cast<double>(b) * spec.model.seq_len * spec.model.d_model;
  const double boundary_bytes = sp ? activation_bytes / TP : activation_bytes;
  const double tp_sum = costs.allreduce_s(activation_bytes, TP);
  const double rerun = par.recompute == Recompute::none ? 0 : 2, regather = sp ? 1 : 0;
  const bool apart = schedule.splits_backward;
  // Each pass's sums, counted once here (stage_passes adds them up per stage like seconds).
  const PassCosts block_sums{2, 2 + rerun + (apart ? 0 : regather), apart ? regather : 0};
  const PassCosts embed_sums{1, regather / 2, 0}, head_sums{regather / 2, 1 + regather / 2, 0};
  auto tensor_part = [&](PassCosts c, const PassCosts& sums) {
    return PassCosts{c.f / TP + sums.f * tp_sum, c.b / TP + sums.b * tp_sum, c.w / TP + sums.w * tp_sum};
  };
  const PassCosts block = tensor_part(costs.block_under(par.recompute, b), block_sums);
  const PassCosts embed = tensor_part(costs.embed(b), embed_sums), head = tensor_part(costs.head(b), head_sums);
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
  const SimResult sim = simulate(lists, fwd, bwd, wgt, place.kind, costs.p2p_s(boundary_bytes));

  StepPrediction r;
  r.pipeline_s = sim.makespan;
  const bool tied_apart = spec.model.tie_embeddings && place.head_stage() != 0;
  const double tied_bytes = sizeof(float) * static_cast<double>(spec.model.vocab) * spec.model.d_model;
  std::vector<double> working(P);  // per stage: computing, reducing gradients, updating
  for (int s = 0; s < P; ++s) {
    double params = 0;
    for (const ParamTensor& t : rank_params(spec, chunks_of(blocks, place, s), n_virtual, TpPart{TP - 1, TP}))
      params += t.size;
    const double finish = sim.spans[s].empty() ? 0 : sim.spans[s].back().end;
    // ZeRO-1's reduce-scatter and all-gather move what one all-reduce moves.
    double reduce = costs.allreduce_s(sizeof(float) * params, D);
    if (tied_apart && (s == 0 || s == place.head_stage())) reduce += costs.allreduce_s(tied_bytes, 2);
    // The step agreement (norm, stop, finite: three doubles over every rank), then the update.
    const double optim =
        costs.allreduce_s(3 * sizeof(double), TP * P * D) + costs.adamw_s(par.zero ? params / D : params);
    working[s] = sim.busy[s] + reduce + optim;
    if (finish + reduce + optim > r.step_s) {
      r.step_s = finish + reduce + optim;
      r.reduce_s = reduce;
      r.optimizer_s = optim;
    }
    if (D > 1) r.reduce_bytes += TP * D * sizeof(float) * params;
    // The stage's tensor sums: per micro-batch, each of its chunks' passes'.
    double sums = 0;
    for (const ChunkRange& c : chunks_of(blocks, place, s)) {
      const PassCosts n = stage_passes(block_sums, embed_sums, head_sums, c.block_end - c.block_begin, c.vstage == 0,
                                       c.vstage == n_virtual - 1);
      sums += n.f + n.backward();
    }
    r.tp_comm_s = std::max(r.tp_comm_s, M * sums * tp_sum);
  }
  if (TP > 1) r.tp_sum_bytes = activation_bytes;
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
    if (place.stage_of(v) != place.stage_of(v + 1)) r.p2p_bytes += 2.0 * M * D * TP * boundary_bytes;
  return r;
}

}  // namespace pipetrain
