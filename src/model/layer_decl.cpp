#include "pipetrain/model/layer_decl.hpp"

namespace pipetrain {

size_t LayerWidths::operator[](Width w) const {
  const size_t moe = shape.moe() ? 1 : 0;
  switch (w) {
    case Width::one:
      return 1;
    case Width::norm_mean:
      return shape.norm_stats - 1;  // LayerNorm keeps a mean and a 1/std, RMSNorm the 1/rms
    case Width::C:
      return shape.C;
    case Width::q:
      return shape.q;
    case Width::qkv:
      return shape.qkv;
    case Width::fc:
      return shape.fc;
    case Width::ffn:
      return shape.ffn;
    case Width::vocab:
      return vocab;
    case Width::experts:
      return shape.experts;
    case Width::moe_C:
      return moe * shape.C;
    case Width::moe_one:
      return moe;
    case Width::top_k:
      return moe * (shape.top_k + (shape.shared_gate ? 1 : 0));
    case Width::shared_fc:
      return 2 * static_cast<size_t>(shape.shared_ffn);
    case Width::shared_ffn:
      return shape.shared_ffn;
    case Width::gated_C:
      return shape.shared_gate ? shape.C : 0;
    case Width::gated_one:
      return shape.shared_gate ? 1 : 0;
    case Width::qk:
      return shape.qk_norm ? static_cast<size_t>(shape.q + shape.kv) : 0;
    case Width::qk_two:
      return shape.qk_norm ? 2 : 0;
    case Width::exchanged_C:
      return shape.held_experts < shape.experts ? shape.C : 0;
  }
  return 0;
}

bool BufferContext::needs(Needed n) const {
  switch (n) {
    case Needed::always:
      return true;
    case Needed::split_only:
      return split;
    case Needed::sequence_parallel:
      return sequence_parallel;
    case Needed::head:
      return last;
    case Needed::head_split_vocab:
      return last && split_vocab;
    case Needed::embedding_split_only:
      return first && split;
  }
  return false;
}

Messages layer_messages(Layer layer, Pass pass, int tp, bool sequence_parallel, const LayerRows& rows,
                        const LayerWidths& widths) {
  Messages m{};
  if (tp <= 1) return m;
  const double whole_rows = sizeof(float) * static_cast<double>(rows.tokens) * widths.shape.C;
  for (const ExchangeDecl& d : kLayerExchanges) {
    if (d.layer != layer || d.pass != pass) continue;
    if (d.kind == Exchange::gather && !sequence_parallel) continue;
    if (d.kind == Exchange::qk_norm && !widths.shape.qk_norm) continue;
    const double bytes = d.kind == Exchange::max     ? sizeof(float) * static_cast<double>(rows.tokens)
                         : d.kind == Exchange::stats ? sizeof(double) * kSplitVocabDoublesPerRow * rows.tokens
                         : d.kind == Exchange::route
                             ? sizeof(float) * static_cast<double>(rows.tokens) * widths[Width::top_k]
                         : d.kind == Exchange::qk_norm ? sizeof(float) * 2.0 * rows.tokens
                                                       : whole_rows;
    MessageCount& c = m[static_cast<int>(d.kind)];
    c.calls += d.count;
    c.bytes += d.count * bytes;
  }
  return m;
}

PassFlops layer_flops(Layer layer, Pass pass, const LayerWidths& widths, int seq_len) {
  const double C = widths.shape.C;
  if (layer == Layer::embedding) return {0, 0, pass == Pass::input ? 0 : C};  // a row added; scattered back
  if (layer == Layer::head) return {2 * C * widths.vocab, 0, 0};
  // Each pass runs every weight product once (forward, input gradient, weight gradient);
  // attention's forward is two products over T keys, its backward four.
  const double products = 2 * block_weight_macs(widths.shape), attention = 4.0 * seq_len * widths.shape.q;
  if (pass == Pass::forward) return {products, attention, 0};
  if (pass == Pass::input) return {products, 2 * attention, 0};
  return {products, 0, 0};
}

PassFlops layer_training_flops(Layer layer, const LayerWidths& widths, int seq_len) {
  PassFlops sum;
  for (Pass pass : {Pass::forward, Pass::input, Pass::weight}) sum.add(layer_flops(layer, pass, widths, seq_len));
  return sum;
}

std::vector<Pass> passes_run(Layer layer, ChunkPass pass, Recompute mode) {
  switch (pass) {
    case ChunkPass::forward:
      return {Pass::forward};
    case ChunkPass::backward_input:
      return {Pass::input};
    case ChunkPass::backward_weight:
      return {Pass::weight};
    case ChunkPass::backward:
      break;
  }
  const bool rerun = mode == Recompute::stage || (mode == Recompute::block && layer != Layer::embedding);
  if (rerun) return {Pass::forward, Pass::input, Pass::weight};
  return {Pass::input, Pass::weight};
}

BlockKinds block_kinds(const RunSpec& spec, BlockSpan span) {
  BlockKinds k;
  for (int i = span.begin; i < span.end; ++i) ++(spec.model.moe.block_is_moe(i) ? k.moe : k.dense);
  return k;
}

namespace {
// Each layer of a chunk with how many of it there are.
template <class F>
void for_each_layer(const RunSpec& spec, BlockSpan blocks, bool first, bool last, F f) {
  if (first) f(Layer::embedding, 1);
  const BlockKinds kinds = block_kinds(spec, blocks);
  if (kinds.dense) f(Layer::block, kinds.dense);
  if (kinds.moe) f(Layer::moe_block, kinds.moe);
  if (last) f(Layer::head, 1);
}
}  // namespace

Messages chunk_messages(const RunSpec& spec, BlockSpan blocks, bool first, bool last, ChunkPass pass) {
  const int tp = spec.parallel.tp;
  const bool sp = spec.parallel.sequence_parallel && tp > 1;
  const LayerRows rows = micro_batch_rows(spec);
  Messages sum{};
  for_each_layer(spec, blocks, first, last, [&](Layer layer, int n) {
    const LayerWidths widths = rank_widths(spec, layer);
    for (Pass p : passes_run(layer, pass, spec.parallel.recompute))
      add(sum, layer_messages(layer, p, tp, sp, rows, widths), n);
  });
  return sum;
}

PassFlops chunk_flops(const RunSpec& spec, BlockSpan blocks, bool first, bool last, ChunkPass pass) {
  const double tokens = micro_batch_rows(spec).tokens;
  PassFlops sum;
  for_each_layer(spec, blocks, first, last, [&](Layer layer, int n) {
    const LayerWidths widths = rank_widths(spec, layer);
    for (Pass p : passes_run(layer, pass, spec.parallel.recompute))
      sum.add(layer_flops(layer, p, widths, spec.model.seq_len), n * tokens);
  });
  return sum;
}

namespace {
// The widths of `layer`'s block: an MoE block's (block every - 1 is one), else the dense one's.
BlockShape layer_shape(const RunSpec& spec, Layer layer) {
  const auto& moe = spec.model.moe;
  return layer == Layer::moe_block && moe.on() ? block_shape(spec, moe.every - 1) : block_shape(spec);
}
}  // namespace

LayerWidths whole_widths(const RunSpec& spec, Layer layer) {
  return {layer_shape(spec, layer), static_cast<size_t>(spec.model.vocab)};
}

LayerWidths rank_widths(const RunSpec& spec, Layer layer) {
  const int tp = spec.parallel.tp;
  return {tensor_part(layer_shape(spec, layer), tp), (static_cast<size_t>(spec.model.vocab) + tp - 1) / tp};
}

LayerRows micro_batch_rows(const RunSpec& spec) {
  const size_t b = spec.samples_per_micro_batch(), T = spec.model.seq_len, tp = spec.parallel.tp;
  LayerRows r;
  r.tokens = b * T;
  r.kept = spec.parallel.sequence_parallel && tp > 1 ? r.tokens / tp : r.tokens;
  r.attention = b * rank_widths(spec).shape.NH * T;
  return r;
}

}  // namespace pipetrain
