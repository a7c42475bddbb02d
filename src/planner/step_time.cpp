#include "pipetrain/planner/step_time.hpp"

#include <algorithm>
#include <cmath>

#include "pipetrain/model/layer_decl.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/planner/reduce_overlap.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

namespace {

// Seconds of what `layer`'s `pass` exchanges with its tensor group (layer_decl.hpp), at the
// measured all-reduce's cost: an all-gather or a reduce-scatter moves half of what an all-reduce
// of the same rows moves.
double exchange_s(const MachineCosts& costs, Layer layer, Pass pass, int tp, bool sp, const LayerRows& rows, size_t C) {
  const Messages m = layer_messages(layer, pass, tp, sp, rows, C);
  double s = 0;
  for (int k = 0; k < kExchanges; ++k) {
    if (m[k].calls == 0) continue;
    const bool half = k == static_cast<int>(Exchange::gather) || (k == static_cast<int>(Exchange::sum) && sp);
    s += m[k].calls * costs.allreduce_s(m[k].bytes / m[k].calls, tp) * (half ? 0.5 : 1);
  }
  return s;
}

// A layer's exchanges per pass, in seconds, as passes_run says which of its declared passes each
// of the executor's passes runs.
PassCosts layer_exchanges(const MachineCosts& costs, const RunSpec& spec, Layer layer, bool apart) {
  const int tp = spec.parallel.tp;
  const bool sp = spec.parallel.sequence_parallel && tp > 1;
  const LayerRows rows = micro_batch_rows(spec);
  auto at = [&](ChunkPass pass) {
    double s = 0;
    for (Pass p : passes_run(layer, pass, spec.parallel.recompute))
      s += exchange_s(costs, layer, p, tp, sp, rows, spec.model.d_model);
    return s;
  };
  return apart ? PassCosts{at(ChunkPass::forward), at(ChunkPass::backward_input), at(ChunkPass::backward_weight)}
               : PassCosts{at(ChunkPass::forward), at(ChunkPass::backward), 0};
}

// Each chunk's last backward on `stage` (a split backward's W), in the order they run.
std::vector<FinishingChunk> finishing_chunks(const std::vector<SimSpan>& spans, const RunSpec& spec,
                                             const std::vector<ChunkRange>& chunks, int n_virtual, TpPart tp) {
  std::vector<double> floats;  // per chunk: the tensors it adds to the rank's buffer
  double before = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    double all = 0;
    for (const ParamTensor& t : rank_params(spec, {chunks.begin(), chunks.begin() + c + 1}, n_virtual, tp))
      all += t.size;
    floats.push_back(all - before);
    before = all;
  }
  std::vector<const SimSpan*> last(chunks.size(), nullptr);
  for (const SimSpan& s : spans)
    if (s.action.op == Op::backward || s.action.op == Op::backward_weight) last[s.action.chunk] = &s;
  std::vector<FinishingChunk> out;
  for (size_t c = 0; c < chunks.size(); ++c)
    if (last[c]) out.push_back({last[c]->start, last[c]->end, floats[c]});
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.end < b.end; });
  return out;
}

// What GradReducer posts, in order: buckets of `bucket` floats cut from the buffer's end, or
// (bucket 0: ZeRO-1) each tensor whole, from the last.
std::vector<double> reduce_pieces(const std::vector<ParamTensor>& tensors, double bucket) {
  double total = 0;
  for (const ParamTensor& t : tensors) total += t.size;
  std::vector<double> pieces;
  if (bucket > 0) {
    for (; total > 0; total -= std::min(bucket, total)) pieces.push_back(std::min(bucket, total));
  } else {
    for (auto t = tensors.rbegin(); t != tensors.rend(); ++t) pieces.push_back(t->size);
  }
  return pieces;
}

}  // namespace

StepPrediction predict_step(const RunSpec& spec, const MachineCosts& costs) {
  const auto& par = spec.parallel;
  const ScheduleKind& schedule = *par.schedule;
  const ChunkPlacement place = spec.chunk_placement();
  const int P = par.pp, D = par.dp, M = par.micro_batches, n_virtual = place.virtual_stages();
  const int b = spec.samples_per_micro_batch();
  const std::vector<int> blocks = partition_blocks(spec);
  // On a tensor rank each pass computes a tp-th of its products and adds its declared exchanges
  // with the tensor group; with sequence parallelism a pipeline message carries a tp-th of the
  // activation.
  const int TP = par.tp;
  const bool sp = par.sequence_parallel && TP > 1;
  const double activation_bytes = sizeof(float) * static_cast<double>(b) * spec.model.seq_len * spec.model.d_model;
  const double boundary_bytes = sp ? activation_bytes / TP : activation_bytes;
  const bool apart = schedule.splits_backward;
  const PassCosts block_sums = layer_exchanges(costs, spec, Layer::block, apart),
                  embed_sums = layer_exchanges(costs, spec, Layer::embedding, apart),
                  head_sums = layer_exchanges(costs, spec, Layer::head, apart);
  auto tensor_part = [&](PassCosts c, const PassCosts& sums) {
    return PassCosts{c.f / TP + sums.f, c.b / TP + sums.b, c.w / TP + sums.w};
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
  const double bucket_floats = std::max(1.0, std::floor(spec.comm.bucket_mb * (1 << 20) / sizeof(float)));
  std::vector<double> working(P);  // per stage: computing, waiting on the reduction, updating
  for (int s = 0; s < P; ++s) {
    const TpPart tp{TP - 1, TP};
    const std::vector<ChunkRange> chunks = chunks_of(blocks, place, s);
    const std::vector<ParamTensor> tensors = rank_params(spec, chunks, n_virtual, tp);
    double params = 0;
    for (const ParamTensor& t : tensors) params += t.size;
    const double finish = sim.spans[s].empty() ? 0 : sim.spans[s].back().end;
    // Buckets (ZeRO-1: each tensor's reduce-scatter, about a bucket each) posted during the last
    // backwards; ZeRO-1's all-gather of the updated slabs, as much as a reduce-scatter, waits
    // after the update.
    const double share = par.zero ? 0.5 : 1;
    const ReduceTiming reduce =
        D > 1 ? overlap_reduction(finishing_chunks(sim.spans[s], spec, chunks, n_virtual, tp), finish,
                                  reduce_pieces(tensors, par.zero ? 0 : bucket_floats),
                                  [&](double bytes) { return share * costs.allreduce_s(bytes, D); })
              : ReduceTiming{};
    double gather = par.zero && D > 1 ? 0.5 * costs.allreduce_s(sizeof(float) * params, D) : 0;
    double tied = tied_apart && (s == 0 || s == place.head_stage()) ? costs.allreduce_s(tied_bytes, 2) : 0;
    const double exposed = reduce.exposed_s + gather + tied;
    // The step agreement (norm, stop, finite: three doubles over every rank), then the update.
    const double optim =
        costs.allreduce_s(3 * sizeof(double), TP * P * D) + costs.adamw_s(par.zero ? params / D : params);
    working[s] = sim.busy[s] + exposed + optim;
    if (finish + exposed + optim > r.step_s) {
      r.step_s = finish + exposed + optim;
      r.reduce_s = reduce.total_s + gather + tied;
      r.reduce_exposed_s = exposed;
      r.optimizer_s = optim;
    }
    if (D > 1) r.reduce_bytes += TP * D * sizeof(float) * params;
    // The stage's tensor exchanges: per micro-batch, each of its chunks' passes'.
    double sums = 0;
    for (const ChunkRange& c : chunks) {
      const PassCosts n = stage_passes(block_sums, embed_sums, head_sums, c.block_end - c.block_begin, c.vstage == 0,
                                       c.vstage == n_virtual - 1);
      sums += n.f + n.backward();
    }
    r.tp_comm_s = std::max(r.tp_comm_s, M * sums);
  }
  if (TP > 1) r.tp_sum_bytes = activation_bytes;
  // As metrics' bubble_measured counts it: the share of the step a rank waits for others, in the
  // pipeline and at the step's end for the slowest rank (the exposed reduction is work).
  for (int s = 0; s < P; ++s) r.bubble += r.step_s > 0 ? (1 - working[s] / r.step_s) / P : 0;
  const double tokens = static_cast<double>(spec.train.global_batch) * spec.model.seq_len;
  r.tokens_per_s = r.step_s > 0 ? tokens / r.step_s : 0;
  // What the kernels count: every virtual stage's passes over M micro-batches on each of its tp
  // ranks (a tp-th each) and replicas, recompute's forwards included.
  for (int v = 0; v < n_virtual; ++v) {
    const int n = blocks[v];
    const bool first = v == 0, last = v == n_virtual - 1;
    double per_mb = chunk_flops(spec, n, first, last, ChunkPass::forward).model();
    for (ChunkPass p : apart ? std::vector<ChunkPass>{ChunkPass::backward_input, ChunkPass::backward_weight}
                             : std::vector<ChunkPass>{ChunkPass::backward})
      per_mb += chunk_flops(spec, n, first, last, p).model();
    r.flops += static_cast<double>(M) * D * TP * per_mb;
  }
  // Every boundary between virtual stages on different ranks carries an activation and a gradient
  // per micro-batch, in every replica.
  for (int v = 0; v + 1 < n_virtual; ++v)
    if (place.stage_of(v) != place.stage_of(v + 1)) r.p2p_bytes += 2.0 * M * D * TP * boundary_bytes;
  return r;
}

}  // namespace pipetrain
