#include "pipetrain/planner/step_time.hpp"

#include <algorithm>

#include "pipetrain/model/layer_decl.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/planner/reduce_overlap.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

namespace {

// Seconds of what `layer`'s `pass` exchanges with its tensor group (layer_decl.hpp), at the
// measured all-reduce's cost within a node: an all-gather or a reduce-scatter moves half of what an all-reduce
// of the same rows moves.
double exchange_s(const MachineCosts& costs, Layer layer, Pass pass, int tp, bool sp, const LayerRows& rows,
                  const LayerWidths& widths) {
  const Messages m = layer_messages(layer, pass, tp, sp, rows, widths);
  double s = 0;
  for (int k = 0; k < kExchanges; ++k) {
    if (m[k].calls == 0) continue;
    const bool half = k == static_cast<int>(Exchange::gather) || (k == static_cast<int>(Exchange::sum) && sp);
    s += m[k].calls * costs.node_allreduce_s(m[k].bytes / m[k].calls, tp) * (half ? 0.5 : 1);
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
      s += exchange_s(costs, layer, p, tp, sp, rows, rank_widths(spec, layer));
    return s;
  };
  return apart ? PassCosts{at(ChunkPass::forward), at(ChunkPass::backward_input), at(ChunkPass::backward_weight)}
               : PassCosts{at(ChunkPass::forward), at(ChunkPass::backward), 0};
}

// Expert parallelism's all-to-alls in each pass of the mean block (the MoE blocks' share of the
// blocks carries them): a micro-batch's N top_k rows of d_model floats, (ep - 1) / ep of them to
// other ranks, priced as one message of those bytes on the link (the ranks send and receive at
// once), with the router spreading them evenly. Forward: out and back; a fused backward: the
// gradients out, the inputs out again, the gradients back (and recompute's forward again); its
// input half: out and back; its weight half: gradients and inputs out again.
PassCosts expert_exchanges(const MachineCosts& costs, const RunSpec& spec, bool apart) {
  const int ep = spec.parallel.ep, L = spec.model.n_layer;
  if (ep == 1 || !spec.model.moe.on()) return {};
  const double share = static_cast<double>(block_kinds(spec, {0, L}).moe) / L;
  const double bytes = sizeof(float) * static_cast<double>(micro_batch_rows(spec).tokens) * spec.model.moe.top_k *
                       spec.model.d_model * (ep - 1) / ep;
  const double one = share * costs.p2p_s(bytes), forward = 2 * one;
  if (apart) return {forward, 2 * one, 2 * one};
  return {forward, 3 * one + (spec.parallel.recompute != Recompute::none ? forward : 0), 0};
}

// Each chunk's last backward on `stage` (a split backward's W), in the order they run.
std::vector<FinishingChunk> finishing_chunks(const std::vector<SimSpan>& spans, const RunSpec& spec,
                                             const std::vector<ChunkRange>& chunks, int n_virtual, TpPart tp,
                                             TpPart ep) {
  std::vector<double> floats;  // per chunk: the tensors it adds to the rank's buffer
  double before = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    double all = 0;
    for (const ParamTensor& t : rank_params(spec, {chunks.begin(), chunks.begin() + c + 1}, n_virtual, tp, ep))
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

// Each pass of a block, the embedding and the head on a tensor rank: a tp-th of its compute plus
// its declared exchanges with the tensor group (the `sums`, also kept apart).
struct LayerPassCosts {
  PassCosts block, embed, head, block_sums, embed_sums, head_sums;
  PassCosts block_all_to_all;  // expert parallelism's, in block
};
LayerPassCosts layer_pass_costs(const RunSpec& spec, const MachineCosts& costs) {
  const int TP = spec.parallel.tp, b = spec.samples_per_micro_batch();
  const bool apart = spec.parallel.schedule->splits_backward;
  LayerPassCosts c;
  c.block_sums = layer_exchanges(costs, spec, Layer::block, apart);
  c.embed_sums = layer_exchanges(costs, spec, Layer::embedding, apart);
  c.head_sums = layer_exchanges(costs, spec, Layer::head, apart);
  auto tensor_part = [&](PassCosts p, const PassCosts& sums) {
    return PassCosts{p.f / TP + sums.f, p.b / TP + sums.b, p.w / TP + sums.w};
  };
  c.block_all_to_all = expert_exchanges(costs, spec, apart);
  c.block = tensor_part(costs.block_under(spec.parallel.recompute, b), c.block_sums);
  c.block.f += c.block_all_to_all.f;
  c.block.b += c.block_all_to_all.b;
  c.block.w += c.block_all_to_all.w;
  c.embed = tensor_part(costs.embed(b), c.embed_sums);
  c.head = tensor_part(costs.head(b), c.head_sums);
  return c;
}

// ZeRO-3's layer gathers (train/param_fetch.hpp) in one pass over a chunk's layers, in the order
// the pass reads them: each layer's all-gather is posted as the layer before it starts, so where it
// travels beside compute (`overlaps`) it hides behind that layer's compute and the first one is
// exposed whole; where the rank's own cores move it (a CPU), all of it is.
struct GatherTime {
  double total = 0, exposed = 0;
};
GatherTime layer_gathers(const std::vector<double>& compute_s, const std::vector<double>& gather_s, bool overlaps) {
  GatherTime t;
  for (size_t i = 0; i < gather_s.size(); ++i) {
    t.total += gather_s[i];
    t.exposed += i == 0 || !overlaps ? gather_s[i] : std::max(0.0, gather_s[i] - compute_s[i - 1]);
  }
  return t;
}

// Per micro-batch of a virtual stage, what ZeRO-3's gathers add to its forward and to its
// backward (exposed), and per step all of them (total): under reshard_after_forward every
// forward and backward gathers again (a stage recompute's forward too); otherwise the step's
// first forward gathers each layer once, spread here over the M forwards.
struct ChunkGathers {
  double forward = 0, backward = 0, total = 0;
};
ChunkGathers chunk_gathers(const RunSpec& spec, const MachineCosts& costs, const LayerPassCosts& c, int blocks,
                           bool first, bool last) {
  const auto& par = spec.parallel;
  const TpPart tp{par.tp - 1, par.tp};
  // A layer's all-gather: half an all-reduce of its bytes over the replicas; where the cores move
  // it, each tensor's (LayerGather posts one per tensor: each pays its latency there) as measured
  // into memory given back (costs.gather_refill, taken as measured whatever dp).
  const bool overlaps = costs.gather_refill.empty();
  auto gather_s = [&](const std::vector<ParamTensor>& tensors) {
    double bytes = 0, cores_s = 0;
    for (const ParamTensor& t : tensors) {
      bytes += sizeof(float) * t.size;
      cores_s += costs.gather_refill_s(sizeof(float) * t.size);
    }
    return overlaps ? 0.5 * costs.allreduce_s(bytes, par.dp) : cores_s;
  };
  const TpPart ep{0, par.ep};
  const double embed = gather_s(stage_params(spec, 0, 3, 0, 0, tp, ep)),
               block = gather_s(stage_params(spec, 1, 3, 0, 1, tp, ep)),
               head = gather_s(stage_params(spec, 2, 3, 0, 0, tp, ep));
  std::vector<double> f_compute, f_gather, b_compute, b_gather;  // in each pass's order
  if (first) f_compute.push_back(c.embed.f), f_gather.push_back(embed);
  for (int i = 0; i < blocks; ++i) f_compute.push_back(c.block.f), f_gather.push_back(block);
  if (last) {
    f_compute.push_back(c.head.f), f_gather.push_back(head);
    b_compute.push_back(c.head.backward()), b_gather.push_back(head);
  }
  for (int i = 0; i < blocks; ++i) b_compute.push_back(c.block.backward()), b_gather.push_back(block);
  const GatherTime f = layer_gathers(f_compute, f_gather, overlaps), b = layer_gathers(b_compute, b_gather, overlaps);
  const int M = par.micro_batches;
  if (!par.reshards_after_forward()) return {f.exposed / M, 0, f.total};
  // The last backward's gathers share the link with the gradients' reduce-scatters: half of it each.
  std::vector<double> shared = b_gather;
  for (double& g : shared) g *= overlaps ? 2 : 1;
  const double b_exposed = ((M - 1) * b.exposed + layer_gathers(b_compute, shared, overlaps).exposed) / M;
  const bool refetch = par.recompute == Recompute::stage;  // the backward's re-run forward gathers too
  return {f.exposed, b_exposed + (refetch ? f.exposed : 0), M * (f.total + b.total + (refetch ? f.total : 0))};
}

// chunk_gathers of every virtual stage (nothing below ZeRO-3 or with one replica).
std::vector<ChunkGathers> virtual_stage_gathers(const RunSpec& spec, const MachineCosts& costs, const LayerPassCosts& c,
                                                const std::vector<int>& blocks) {
  const int n_virtual = static_cast<int>(blocks.size());
  std::vector<ChunkGathers> out(n_virtual);
  if (spec.parallel.zero < 3 || spec.parallel.dp < 2) return out;
  for (int v = 0; v < n_virtual; ++v) out[v] = chunk_gathers(spec, costs, c, blocks[v], v == 0, v == n_virtual - 1);
  return out;
}

// Every rank's action list simulated with each virtual stage's passes and the message time.
SimResult simulate_step(const RunSpec& spec, const MachineCosts& costs, const LayerPassCosts& c,
                        const std::vector<int>& blocks, const std::vector<ChunkGathers>& gathers,
                        double boundary_bytes) {
  const ChunkPlacement place = spec.chunk_placement();
  const int n_virtual = place.virtual_stages();
  std::vector<double> fwd, bwd, wgt;
  for (int v = 0; v < n_virtual; ++v) {
    const PassCosts p = stage_passes(c.block, c.embed, c.head, blocks[v], v == 0, v == n_virtual - 1);
    fwd.push_back(p.f + gathers[v].forward);
    bwd.push_back(p.backward() + gathers[v].backward);
    wgt.push_back(p.w);
  }
  std::vector<ActionList> lists;
  for (int s = 0; s < spec.parallel.pp; ++s)
    lists.push_back(spec.parallel.schedule->generate(s, spec.pipeline_shape()));
  return simulate(lists, fwd, bwd, wgt, place.kind, costs.p2p_s(boundary_bytes));
}

// What a rank does after its last backward: the reduction its backward leaves exposed (of all of
// it), ZeRO-1's gather, the tied embedding's sum, the agreement and the update.
struct StageTail {
  double params = 0, finish = 0, reduce_total = 0, exposed = 0, optim = 0;
};
StageTail stage_tail(const RunSpec& spec, const MachineCosts& costs, const SimResult& sim, int s,
                     const std::vector<ChunkRange>& chunks) {
  const auto& par = spec.parallel;
  const ChunkPlacement place = spec.chunk_placement();
  const int D = par.dp, n_virtual = place.virtual_stages();
  // A rank's parts: the last tensor rank's (the most vocabulary rows), an expert rank's experts. An
  // expert tensor's reduction is priced over the data group (its replicas are fewer: an upper bound).
  const TpPart tp{par.tp - 1, par.tp}, ep{0, par.ep};
  const std::vector<ParamTensor> tensors = rank_params(spec, chunks, n_virtual, tp, ep);
  StageTail t;
  for (const ParamTensor& p : tensors) t.params += p.size;
  t.finish = sim.spans[s].empty() ? 0 : sim.spans[s].back().end;
  // Buckets (ZeRO-1: each tensor's reduce-scatter) posted during the last backwards; ZeRO-1's
  // all-gather of the updated slabs, as much as a reduce-scatter, waits after the update.
  const double share = par.zero ? 0.5 : 1;
  const ReduceTiming reduce =
      D > 1 ? overlap_reduction(finishing_chunks(sim.spans[s], spec, chunks, n_virtual, tp, ep), t.finish,
                                reduce_pieces(tensors, par.zero ? 0 : static_cast<double>(spec.comm.bucket_floats())),
                                [&](double bytes) { return share * costs.allreduce_s(bytes, D); })
            : ReduceTiming{};
  const double gather = par.zero && par.zero < 3 && D > 1 ? 0.5 * costs.allreduce_s(sizeof(float) * t.params, D) : 0;
  const bool tied_apart = spec.model.tie_embeddings && place.head_stage() != 0;
  const double tied_bytes = sizeof(float) * static_cast<double>(spec.model.vocab) * spec.model.d_model;
  const double tied = tied_apart && (s == 0 || s == place.head_stage()) ? costs.allreduce_s(tied_bytes, 2) : 0;
  t.reduce_total = reduce.total_s + gather + tied;
  t.exposed = reduce.exposed_s + gather + tied;
  // The step agreement (norm, stop, finite: three doubles over every rank), then the update.
  t.optim =
      costs.allreduce_s(3 * sizeof(double), par.tp * par.pp * D) + costs.adamw_s(par.zero ? t.params / D : t.params);
  return t;
}

// What the kernels count in a step: every virtual stage's passes over M micro-batches on each of
// its tp ranks (a tp-th each) and replicas, recompute's forwards included.
double step_flops(const RunSpec& spec, const std::vector<int>& blocks) {
  const auto& par = spec.parallel;
  const int n_virtual = spec.chunk_placement().virtual_stages();
  const std::vector<ChunkPass> backward =
      par.schedule->splits_backward ? std::vector<ChunkPass>{ChunkPass::backward_input, ChunkPass::backward_weight}
                                    : std::vector<ChunkPass>{ChunkPass::backward};
  double flops = 0;
  int begin = 0;  // the virtual stage's first block
  for (int v = 0; v < n_virtual; ++v) {
    const bool first = v == 0, last = v == n_virtual - 1;
    const BlockSpan span{begin, begin + blocks[v]};
    begin = span.end;
    double per_mb = chunk_flops(spec, span, first, last, ChunkPass::forward).model();
    for (ChunkPass p : backward) per_mb += chunk_flops(spec, span, first, last, p).model();
    flops += static_cast<double>(par.micro_batches) * par.dp * par.tp * per_mb;
  }
  return flops;
}

}  // namespace

StepPrediction predict_step(const RunSpec& spec, const MachineCosts& costs) {
  const auto& par = spec.parallel;
  const ChunkPlacement place = spec.chunk_placement();
  const int P = par.pp, M = par.micro_batches, TP = par.tp;
  // With sequence parallelism a pipeline message carries a tp-th of the activation.
  const double activation_bytes =
      sizeof(float) * static_cast<double>(spec.samples_per_micro_batch()) * spec.model.seq_len * spec.model.d_model;
  const double boundary_bytes = par.sequence_parallel && TP > 1 ? activation_bytes / TP : activation_bytes;
  const LayerPassCosts passes = layer_pass_costs(spec, costs);
  const std::vector<int> blocks = partition_blocks(spec);  // per virtual stage
  const std::vector<ChunkGathers> gathers = virtual_stage_gathers(spec, costs, passes, blocks);
  const SimResult sim = simulate_step(spec, costs, passes, blocks, gathers, boundary_bytes);
  StepPrediction r;
  r.pipeline_s = sim.makespan;
  std::vector<double> working(P);  // per stage: computing, waiting on the reduction, updating
  for (int s = 0; s < P; ++s) {
    const std::vector<ChunkRange> chunks = chunks_of(blocks, place, s);
    const StageTail t = stage_tail(spec, costs, sim, s, chunks);
    working[s] = sim.busy[s] + t.exposed + t.optim;
    if (t.finish + t.exposed + t.optim > r.step_s) {
      r.step_s = t.finish + t.exposed + t.optim;
      r.reduce_s = t.reduce_total;
      r.reduce_exposed_s = t.exposed;
      r.optimizer_s = t.optim;
    }
    if (par.dp > 1) r.reduce_bytes += TP * par.dp * sizeof(float) * t.params;
    double sums = 0, all_to_all = 0;   // the stage's tensor exchanges and all-to-alls: per micro-batch, its chunks'
    double gathered = 0, exposed = 0;  // its ZeRO-3 gathers a step, all and exposed
    for (const ChunkRange& c : chunks) {
      const PassCosts x =
          stage_passes(passes.block_sums, passes.embed_sums, passes.head_sums, c.block_end - c.block_begin,
                       c.vstage == 0, c.vstage == place.virtual_stages() - 1);
      sums += x.f + x.backward();
      const PassCosts a = stage_passes(passes.block_all_to_all, {}, {}, c.block_end - c.block_begin, false, false);
      all_to_all += a.f + a.backward();
      gathered += gathers[c.vstage].total;
      exposed += M * (gathers[c.vstage].forward + gathers[c.vstage].backward);
    }
    r.tp_comm_s = std::max(r.tp_comm_s, M * sums);
    r.ep_comm_s = std::max(r.ep_comm_s, M * all_to_all);
    if (gathered > r.gather_s) {
      r.gather_s = gathered;
      r.gather_exposed_s = exposed;
    }
  }
  if (TP > 1) r.tp_sum_bytes = activation_bytes;
  // As metrics' bubble_measured counts it: the share of the step a rank waits for others, in the
  // pipeline and at the step's end for the slowest rank (the exposed reduction is work).
  for (int s = 0; s < P; ++s) r.bubble += r.step_s > 0 ? (1 - working[s] / r.step_s) / P : 0;
  const double tokens = static_cast<double>(spec.train.global_batch) * spec.model.seq_len;
  r.tokens_per_s = r.step_s > 0 ? tokens / r.step_s : 0;
  r.flops = step_flops(spec, blocks);
  // Every boundary between virtual stages on different ranks carries an activation and a gradient
  // per micro-batch, in every replica.
  for (int v = 0; v + 1 < place.virtual_stages(); ++v)
    if (place.stage_of(v) != place.stage_of(v + 1)) r.p2p_bytes += 2.0 * M * par.dp * TP * boundary_bytes;
  return r;
}

}  // namespace pipetrain
