#include "pipetrain/model/layer_decl.hpp"

namespace pipetrain {

size_t LayerWidths::operator[](Width w) const {
  if (w == Width::vocab) return vocab;
  if (w == Width::norm_mean) return shape.norm_stats - 1;  // LayerNorm keeps a mean and a 1/std, RMSNorm the 1/rms
  // The others are the block's own dimensions (one: Dim::none, extent 1).
  constexpr Dim dims[] = {Dim::none, Dim::none, Dim::C, Dim::q, Dim::qkv, Dim::fc, Dim::ffn};
  return extent(dims[static_cast<int>(w)], shape);
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

Messages layer_messages(Layer layer, Pass pass, int tp, bool sequence_parallel, const LayerRows& rows, size_t C) {
  Messages m{};
  if (tp <= 1) return m;
  const double whole_rows = sizeof(float) * static_cast<double>(rows.tokens) * C;
  for (const ExchangeDecl& d : kLayerExchanges) {
    if (d.layer != layer || d.pass != pass) continue;
    if (d.kind == Exchange::gather && !sequence_parallel) continue;
    const double bytes = d.kind == Exchange::max     ? sizeof(float) * static_cast<double>(rows.tokens)
                         : d.kind == Exchange::stats ? sizeof(double) * kSplitVocabDoublesPerRow * rows.tokens
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

namespace {
// Each layer of a chunk with how many of it there are.
template <class F>
void for_each_layer(int blocks, bool first, bool last, F f) {
  if (first) f(Layer::embedding, 1);
  f(Layer::block, blocks);
  if (last) f(Layer::head, 1);
}
}  // namespace

Messages chunk_messages(const RunSpec& spec, int blocks, bool first, bool last, ChunkPass pass) {
  const int tp = spec.parallel.tp;
  const bool sp = spec.parallel.sequence_parallel && tp > 1;
  const LayerRows rows = micro_batch_rows(spec);
  Messages sum{};
  for_each_layer(blocks, first, last, [&](Layer layer, int n) {
    for (Pass p : passes_run(layer, pass, spec.parallel.recompute))
      add(sum, layer_messages(layer, p, tp, sp, rows, spec.model.d_model), n);
  });
  return sum;
}

PassFlops chunk_flops(const RunSpec& spec, int blocks, bool first, bool last, ChunkPass pass) {
  const LayerWidths widths = rank_widths(spec);
  const double tokens = micro_batch_rows(spec).tokens;
  PassFlops sum;
  for_each_layer(blocks, first, last, [&](Layer layer, int n) {
    for (Pass p : passes_run(layer, pass, spec.parallel.recompute))
      sum.add(layer_flops(layer, p, widths, spec.model.seq_len), n * tokens);
  });
  return sum;
}

LayerWidths whole_widths(const RunSpec& spec) { return {block_shape(spec), static_cast<size_t>(spec.model.vocab)}; }

LayerWidths rank_widths(const RunSpec& spec) {
  const int tp = spec.parallel.tp;
  return {tensor_part(block_shape(spec), tp), (static_cast<size_t>(spec.model.vocab) + tp - 1) / tp};
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
