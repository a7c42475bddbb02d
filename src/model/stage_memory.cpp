#include "pipetrain/model/stage_memory.hpp"

#include <algorithm>
#include <tuple>
#include <utility>

#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/moe_kernels.hpp"
#include "pipetrain/model/layer_decl.hpp"
#include "pipetrain/schedule/actions.hpp"

namespace pipetrain {
namespace {

// One micro-batch's activations of a chunk (its inputs aside), in floats: every block's declared
// activations and input, and on the last stage the head's and its input.
size_t activation_floats(const RunSpec& spec, bool first, bool last, BlockSpan blocks) {
  const LayerRows rows = micro_batch_rows(spec);
  const LayerWidths widths = rank_widths(spec), moe = rank_widths(spec, Layer::moe_block);
  const BufferContext ctx{first, last};
  const size_t input = rows.kept * widths.shape.C;
  const BlockKinds kinds = block_kinds(spec, blocks);
  return kinds.dense * (declared_floats(kBlockActs, rows, widths, ctx) + input) +
         kinds.moe * (declared_floats(kBlockActs, rows, moe, ctx) + input) +
         (last ? declared_floats(kHeadActs, rows, widths, ctx) + input : 0);
}

// The kernels' own scratch, kept from call to call (what the GPU's scratch slots grow to, each
// counted whole even where two share a slot). Under bf16, on either device, the bf16 copies of the
// matrix products' operands: three buffers each as large as the largest operand of its kind (a
// weight, an input, an output gradient: the head's [tokens, vocabulary part] on the last stage).
// On the CPU: each compute thread's attention blocks. On the GPU: attention's dout . out per row of
// the rank's heads; the loss's row sums (double) on the last stage; on the first the embedding
// gradient's sort of token positions by row (four int arrays and the sort's own storage, about two
// more, and its histograms); two slots of column partial sums (the norms' and biases' gradients,
// one float per 256 rows and column).
size_t kernel_scratch_bytes(const RunSpec& spec, const LayerWidths& widths, bool first, bool last) {
  const BlockShape& s = widths.shape;
  const size_t b = spec.samples_per_micro_batch(), T = spec.model.seq_len, n = b * T, C = s.C;
  size_t bytes = 0;
  if (spec.model.dtype == Dtype::bf16) {
    const size_t V = last ? widths.vocab : 0, q = s.q, qkv = s.qkv, fc = s.fc, ffn = s.ffn;
    const size_t weight = std::max({qkv, q, fc, ffn, V}) * C, inp = n * std::max({C, q, ffn});
    bytes += 2 * (weight + inp + n * std::max({qkv, C, fc, V}));
  }
  if (spec.run.device == Device::cpu)
    return bytes + std::max(1, spec.parallel.threads_per_rank) *
                       attention_scratch_bytes(static_cast<int>(T), s.head_dim, s.NH / s.NKV);
  const size_t widest = std::max<size_t>({C, static_cast<size_t>(s.qkv), static_cast<size_t>(s.fc)});
  return bytes + 4 * b * s.NH * T + (last ? 8 * n : 0) + (first ? 24 * n + (64 << 10) : 0) +
         2 * 4 * ((n + 255) / 256) * widest;
}

// Whether a rank's chunks include the first virtual stage (the embedding) and the last (the head).
std::pair<bool, bool> ends_of(const std::vector<ChunkRange>& chunks, int n_virtual) {
  auto has = [&](int v) { return std::any_of(chunks.begin(), chunks.end(), [&](auto& c) { return c.vstage == v; }); };
  return {has(0), has(n_virtual - 1)};
}

}  // namespace

size_t stash_bytes_per_micro_batch(const RunSpec& spec, int stage, int n_stages, BlockSpan blocks, Recompute mode) {
  const LayerRows rows = micro_batch_rows(spec);
  const bool first = stage == 0, last = stage == n_stages - 1;
  const size_t input = rows.kept * spec.model.d_model;
  size_t floats = 0;
  if (mode == Recompute::none) floats = activation_floats(spec, first, last, blocks);
  if (mode == Recompute::block) floats = input * (blocks.size() + (last ? 1 : 0));
  if (mode == Recompute::stage) floats = first ? 0 : input;
  const size_t ints = rows.tokens * ((first ? 1 : 0) + (last ? 1 : 0));
  return sizeof(float) * floats + sizeof(int) * ints;
}

size_t wgrad_bytes_per_micro_batch(const RunSpec& spec, int stage, int n_stages, BlockSpan blocks) {
  const LayerRows rows = micro_batch_rows(spec);
  const LayerWidths widths = rank_widths(spec), moe = rank_widths(spec, Layer::moe_block);
  const BufferContext split{stage == 0, stage == n_stages - 1, true};
  const BlockKinds kinds = block_kinds(spec, blocks);
  return sizeof(float) * (kinds.dense * declared_floats(kBlockWGrads, rows, widths, split) +
                          kinds.moe * declared_floats(kBlockWGrads, rows, moe, split) +
                          declared_floats(kHeadWGrads, rows, widths, split));
}

size_t stage_scratch_bytes(const RunSpec& spec, const std::vector<ChunkRange>& chunks, int n_virtual) {
  const LayerRows rows = micro_batch_rows(spec);
  const LayerWidths widths = rank_widths(spec), moe = rank_widths(spec, Layer::moe_block);
  const auto [first, last] = ends_of(chunks, n_virtual);
  const bool split_vocab = spec.parallel.tp > 1;
  const BufferContext fused{first, last, false, rows.kept < rows.tokens, split_vocab};
  const size_t floats = declared_floats_widest(kStageScratch, rows, widths, moe, fused) +
                        declared_floats_widest(kBlockWGrads, rows, widths, moe, fused) +
                        declared_floats(kHeadWGrads, rows, widths, fused);
  bool any_moe = false;  // the routing of an MoE block, one at a time
  for (const ChunkRange& c : chunks) any_moe = any_moe || block_kinds(spec, {c.block_begin, c.block_end}).moe > 0;
  const size_t routing =
      any_moe ? moe_routing_bytes(static_cast<int>(rows.tokens), moe.shape.top_k, moe.shape.experts) : 0;
  const size_t doubles = last && split_vocab ? kSplitVocabDoublesPerRow * rows.tokens : 0;
  size_t work = 0;  // the work area: one micro-batch's activations, re-run into under recompute
  if (spec.parallel.recompute != Recompute::none)
    for (const ChunkRange& c : chunks)
      work = std::max(work,
                      activation_floats(spec, c.vstage == 0, c.vstage == n_virtual - 1, {c.block_begin, c.block_end}));
  return sizeof(float) * (floats + work) + sizeof(double) * doubles + routing;
}

size_t working_bytes(const RunSpec& spec, const std::vector<ChunkRange>& chunks, int n_virtual) {
  const auto [first, last] = ends_of(chunks, n_virtual);
  const ChunkPlacement placement = spec.chunk_placement();
  const size_t links = message_links(placement, placement.stage_of(chunks.front().vstage)).size();
  const size_t rings = kMessageRing * links * micro_batch_rows(spec).kept * spec.model.d_model;  // one per link
  return stage_scratch_bytes(spec, chunks, n_virtual) + sizeof(float) * rings +
         kernel_scratch_bytes(spec, rank_widths(spec), first, last);
}

std::vector<int> buffer_pools(const std::vector<ChunkRange>& chunks, int n_virtual) {
  std::vector<std::tuple<int, bool, bool>> shapes;
  std::vector<int> pool;
  for (const ChunkRange& c : chunks) {
    const auto shape = std::make_tuple(c.block_end - c.block_begin, c.vstage == 0, c.vstage == n_virtual - 1);
    auto it = std::find(shapes.begin(), shapes.end(), shape);
    pool.push_back(static_cast<int>(it - shapes.begin()));
    if (it == shapes.end()) shapes.push_back(shape);
  }
  return pool;
}

}  // namespace pipetrain
