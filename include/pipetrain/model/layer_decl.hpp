// What each layer of a stage holds, exchanges with its tensor group and computes, declared once.
// The layers are the embedding (first virtual stage), the blocks and the head (final norm, LM head
// and loss, last virtual stage). Everything that needs these numbers reads them from here: Stage's
// allocator sizes its buffers from the buffer tables, the memory formulas sum the same tables under
// each recompute mode's lifetimes (stage_memory.hpp), the planner prices the declared exchanges and
// FLOPs, the balanced partition and the metrics' MFU count the FLOPs. A new layer kind or buffer is
// one line here plus the kernels that fill it; a test (test_planner_model.cpp) holds a real Stage's
// allocations, tensor-group messages and kernel FLOP counters to these declarations.
//
// A block is dense or an MoE block (model.moe): the same declarations serve both, each buffer's
// size taken from the block's own widths (block_shape(spec, block)): the MLP's rows are a row per
// token and chosen expert (Rows::routed: one per token in a dense block), and the router's and
// shared experts' widths are 0 in a dense block, so it holds none of their buffers.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>

#include "pipetrain/compute/array.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/model/block_tensors.hpp"

namespace pipetrain {

using Floats = Array<float>;  // on the rank's compute device

// The buffers a forward fills for the backward (BlockActs, HeadActs), the output gradients the
// weight half of a backward needs (BlockWGrads, HeadWGrads) and a stage's per-pass scratch.
struct BlockActs {
  Floats ln1, ln1_mean, ln1_rstd, qkv, lse, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  Floats router, router_lse, expert_out, shared_fch, shared_act;  // an MoE block's
  Floats shared_out, shared_gate;  // with a shared-expert gate: their output before it, the gate
  Floats qk_raw, qk_rstd;          // model.qk_norm: q and k before their norm, each's 1/rms
};
struct HeadActs {
  Floats lnf, lnf_mean, lnf_rstd, probs;
};
struct BlockWGrads {
  Floats dout, dfch, dln2, dres2, dqkv, dln1;
  Floats drouter, dshared_fch;  // an MoE block's: the router's logits', the shared experts' product's
  Floats dshared_gate;          // the shared-expert gate's logit's
  Floats dqk_normed;            // model.qk_norm: the normalised q's and k's (for the norms' weights)
};
struct HeadWGrads {
  Floats dlogits, dlnf, dembed;  // dembed: the stage input's gradient (first stage)
};
struct StageScratch {
  Floats attproj, fcproj, datty, dfch_gelu;  // products' outputs and activation gradients, every row
  Floats dres, dx;                           // the residual stream's gradient, in and out of a block
  Floats gathered, dpartial, summed;         // sequence parallelism: whole rows, a partial, summed rows
  Floats logits, row_max;                    // the head's logits; a split vocabulary's row maxima
  // An MoE block's: the experts' input rows (then their gradients), the expert outputs' gradients,
  // the combine weights' gradients (then the gate's), the shared experts' activation gradient, and
  // with a gate their gated output's gradient (then the gate's input gradient).
  Floats routed_in, routed_grad, droute_weight, dshared_act, dshared_out;
  Floats exchanged;  // expert parallelism: the rows as the all-to-alls move them
  Floats qk_sums;    // model.qk_norm: per token the q and k norms' partial sums, summed over the group
};

// How many rows a buffer has, for one micro-batch (or one generation call): every token row, the
// rows this rank keeps of the residual stream and the norms (its tp-th with sequence parallelism),
// one per sample, query head and position (attention's log-sum-exp; none in generation), or the
// MLP's rows (routed: one per token and expert it goes to, one per token in a dense block).
enum class Rows { tokens, kept, attention, routed };
// Floats per row: 1, a LayerNorm's mean (1; RMSNorm keeps none), a block width (this rank's part;
// block_tensors.hpp's Dim of that name), the vocabulary rows this rank holds; and an MoE block's
// (0 in a dense block): the experts, C, 1, top_k (and 1 more with a shared-expert gate: its
// gradient travels with the combine weights'), the shared experts' product and hidden widths, and
// where the shared experts have a gate (0 elsewhere) C and 1; where the block normalises q and k
// (model.qk_norm; 0 elsewhere) their widths together, and 2; where the block's experts are spread
// over expert ranks (parallel.ep; 0 elsewhere) C.
enum class Width {
  one,
  norm_mean,
  C,
  q,
  qkv,
  fc,
  ffn,
  vocab,
  experts,
  moe_C,
  moe_one,
  top_k,
  shared_fc,
  shared_ffn,
  gated_C,
  gated_one,
  qk,
  qk_two,
  exchanged_C
};

struct LayerRows {
  size_t tokens = 0, kept = 0, attention = 0;
  size_t operator[](Rows r) const { return r == Rows::tokens ? tokens : r == Rows::kept ? kept : attention; }
};
// Sizes on one tensor rank: its block widths and its (the largest) vocabulary part.
struct LayerWidths {
  BlockShape shape;
  size_t vocab = 0;
  size_t operator[](Width w) const;
};

// When a buffer is needed. A forward's activations are kept to the backward under recompute = none
// (else they live in one reused set, the stage's work area); block inputs also under recompute =
// block. Output gradients marked split_only exist only where a split backward keeps them from B to
// W (a fused backward reads them where they already are). Scratch entries exist on a stage where
// their condition holds.
enum class Needed { always, split_only, sequence_parallel, head, head_split_vocab, embedding_split_only };

template <class Owner>
struct BufferDecl {
  Floats Owner::*field;
  Rows rows;
  Width width;
  Needed needed = Needed::always;
};

inline constexpr BufferDecl<BlockActs> kBlockActs[] = {
    {&BlockActs::ln1, Rows::kept, Width::C},
    {&BlockActs::ln1_mean, Rows::kept, Width::norm_mean},
    {&BlockActs::ln1_rstd, Rows::kept, Width::one},
    {&BlockActs::qkv, Rows::tokens, Width::qkv},
    {&BlockActs::lse, Rows::attention, Width::one},
    {&BlockActs::atty, Rows::tokens, Width::q},
    {&BlockActs::res2, Rows::kept, Width::C},
    {&BlockActs::ln2, Rows::kept, Width::C},
    {&BlockActs::ln2_mean, Rows::kept, Width::norm_mean},
    {&BlockActs::ln2_rstd, Rows::kept, Width::one},
    {&BlockActs::fch, Rows::routed, Width::fc},
    {&BlockActs::fch_gelu, Rows::routed, Width::ffn},
    {&BlockActs::router, Rows::tokens, Width::experts},  // the router's probabilities
    {&BlockActs::router_lse, Rows::tokens, Width::moe_one},
    {&BlockActs::expert_out, Rows::routed, Width::moe_C},  // each row's expert output, for the combine's gradient
    {&BlockActs::shared_fch, Rows::tokens, Width::shared_fc},
    {&BlockActs::shared_act, Rows::tokens, Width::shared_ffn},
    {&BlockActs::shared_out, Rows::tokens, Width::gated_C},
    {&BlockActs::shared_gate, Rows::tokens, Width::gated_one},  // sigmoid of the gate's logit
    {&BlockActs::qk_raw, Rows::tokens, Width::qk},
    {&BlockActs::qk_rstd, Rows::tokens, Width::qk_two},
};
inline constexpr BufferDecl<HeadActs> kHeadActs[] = {
    {&HeadActs::lnf, Rows::kept, Width::C},
    {&HeadActs::lnf_mean, Rows::kept, Width::norm_mean},
    {&HeadActs::lnf_rstd, Rows::kept, Width::one},
    {&HeadActs::probs, Rows::tokens, Width::vocab},
};
inline constexpr BufferDecl<BlockWGrads> kBlockWGrads[] = {
    {&BlockWGrads::dout, Rows::tokens, Width::C, Needed::split_only},
    {&BlockWGrads::dfch, Rows::routed, Width::fc},
    {&BlockWGrads::dln2, Rows::kept, Width::C},
    {&BlockWGrads::dres2, Rows::tokens, Width::C, Needed::split_only},
    {&BlockWGrads::dqkv, Rows::tokens, Width::qkv},
    {&BlockWGrads::dln1, Rows::kept, Width::C},
    {&BlockWGrads::drouter, Rows::tokens, Width::experts},
    {&BlockWGrads::dshared_fch, Rows::tokens, Width::shared_fc},
    {&BlockWGrads::dshared_gate, Rows::tokens, Width::gated_one},
    {&BlockWGrads::dqk_normed, Rows::tokens, Width::qk, Needed::split_only},
};
inline constexpr BufferDecl<HeadWGrads> kHeadWGrads[] = {
    {&HeadWGrads::dlogits, Rows::tokens, Width::vocab, Needed::head},
    {&HeadWGrads::dlnf, Rows::kept, Width::C, Needed::head},
    {&HeadWGrads::dembed, Rows::kept, Width::C, Needed::embedding_split_only},
};
inline constexpr BufferDecl<StageScratch> kStageScratch[] = {
    {&StageScratch::attproj, Rows::tokens, Width::C},
    {&StageScratch::fcproj, Rows::tokens, Width::C},
    {&StageScratch::datty, Rows::tokens, Width::q},
    {&StageScratch::dfch_gelu, Rows::routed, Width::ffn},
    {&StageScratch::dres, Rows::kept, Width::C},
    {&StageScratch::dx, Rows::kept, Width::C},
    {&StageScratch::gathered, Rows::tokens, Width::C, Needed::sequence_parallel},
    {&StageScratch::dpartial, Rows::tokens, Width::C, Needed::sequence_parallel},
    {&StageScratch::summed, Rows::kept, Width::C, Needed::sequence_parallel},
    {&StageScratch::logits, Rows::tokens, Width::vocab, Needed::head},
    {&StageScratch::row_max, Rows::tokens, Width::one, Needed::head_split_vocab},
    {&StageScratch::routed_in, Rows::routed, Width::moe_C},
    {&StageScratch::routed_grad, Rows::routed, Width::moe_C},
    {&StageScratch::droute_weight, Rows::tokens, Width::top_k},
    {&StageScratch::dshared_act, Rows::tokens, Width::shared_ffn},
    {&StageScratch::dshared_out, Rows::tokens, Width::gated_C},
    {&StageScratch::qk_sums, Rows::tokens, Width::qk_two},
    {&StageScratch::exchanged, Rows::routed, Width::exchanged_C},
};
// A split vocabulary's loss also keeps two double sums per token row (its exponentials', the target
// logit).
inline constexpr size_t kSplitVocabDoublesPerRow = 2;

// Where a buffer is needed: which stage, split backward or not, sequence parallelism, tp.
struct BufferContext {
  bool first = false, last = false, split = false, sequence_parallel = false, split_vocab = false;
  bool needs(Needed n) const;
};

template <class Owner>
size_t floats_of(const BufferDecl<Owner>& d, const LayerRows& rows, const LayerWidths& widths) {
  const size_t n = d.rows == Rows::routed ? rows.tokens * widths.shape.routes() : rows[d.rows];
  return n * widths[d.width];
}
// Sizes every declared buffer of `owner` that `ctx` needs (the others to 0); returns their floats.
template <class Owner, size_t K>
size_t size_declared(Owner& owner, const BufferDecl<Owner> (&table)[K], const LayerRows& rows,
                     const LayerWidths& widths, const BufferContext& ctx) {
  size_t floats = 0;
  for (const BufferDecl<Owner>& d : table) {
    const size_t n = ctx.needs(d.needed) ? floats_of(d, rows, widths) : 0;
    (owner.*d.field).resize(n);
    floats += n;
  }
  return floats;
}
// Their floats alone, allocating nothing.
template <class Owner, size_t K>
size_t declared_floats(const BufferDecl<Owner> (&table)[K], const LayerRows& rows, const LayerWidths& widths,
                       const BufferContext& ctx) {
  size_t floats = 0;
  for (const BufferDecl<Owner>& d : table)
    if (ctx.needs(d.needed)) floats += floats_of(d, rows, widths);
  return floats;
}
// Every declared buffer of `owner`, as f(Floats&).
template <class Owner, size_t K, class F>
void for_each_declared(Owner& owner, const BufferDecl<std::remove_const_t<Owner>> (&table)[K], F f) {
  for (const auto& d : table) f(owner.*d.field);
}

// ---- Messages: what a layer's pass exchanges with its tensor group ----

// A block is dense or an MoE block (moe_block): the same passes, its own widths and exchanges.
enum class Layer { embedding, block, moe_block, head };
// A backward runs as one pass (input and weight together, and under recompute its forward again)
// or split into its input-gradient half (B) and its weight-gradient half (W).
enum class Pass { forward, input, weight };
// gather: this rank's kept rows of C all-gathered into every row (sequence parallelism only).
// sum: a product's partial [rows, C] summed over the group: an all-reduce, or with sequence
// parallelism a reduce-scatter into the kept rows. max: one float per token row (a split
// vocabulary's row maxima); stats: two doubles per token row (its sums). The last two only where
// the vocabulary is split. route: an MoE block's combine-weight gradients, top_k floats per token
// row (and one more, the shared-expert gate's), summed (each rank's expert outputs are partial sums
// over its part of the experts' width). qk_norm: model.qk_norm's two floats per token row, q's and
// k's sums over the heads the rank holds (of squares forward, of the gradient's products backward).
enum class Exchange { gather, sum, max, stats, route, qk_norm };
constexpr int kExchanges = 6;

struct ExchangeDecl {
  Layer layer;
  Pass pass;
  Exchange kind;
  int count;
  const char* what;
};
inline constexpr ExchangeDecl kLayerExchanges[] = {
    {Layer::embedding, Pass::forward, Exchange::sum, 1, "the vocabulary parts' embeddings"},
    {Layer::embedding, Pass::weight, Exchange::gather, 1, "the input gradient, for the embedding's"},
    {Layer::block, Pass::forward, Exchange::gather, 2, "ln1 and ln2, the products' inputs"},
    {Layer::block, Pass::forward, Exchange::sum, 2, "the attention and MLP output products"},
    {Layer::block, Pass::forward, Exchange::qk_norm, 1, "q's and k's sums of squares"},
    {Layer::block, Pass::input, Exchange::qk_norm, 1, "q's and k's norms' gradient sums"},
    {Layer::block, Pass::input, Exchange::gather, 2, "the output and res2 gradients"},
    {Layer::block, Pass::input, Exchange::sum, 2, "the ln1 and ln2 outputs' gradients"},
    {Layer::block, Pass::weight, Exchange::gather, 2, "ln1 and ln2 again, for the weight gradients"},
    {Layer::moe_block, Pass::forward, Exchange::gather, 2, "ln1 and ln2, the products' inputs"},
    {Layer::moe_block, Pass::forward, Exchange::sum, 2, "the attention and MLP output products"},
    {Layer::moe_block, Pass::forward, Exchange::qk_norm, 1, "q's and k's sums of squares"},
    {Layer::moe_block, Pass::input, Exchange::qk_norm, 1, "q's and k's norms' gradient sums"},
    {Layer::moe_block, Pass::input, Exchange::gather, 2, "the output and res2 gradients"},
    {Layer::moe_block, Pass::input, Exchange::route, 1, "the combine weights' gradients"},
    {Layer::moe_block, Pass::input, Exchange::sum, 2, "the ln1 and ln2 outputs' gradients"},
    {Layer::moe_block, Pass::weight, Exchange::gather, 2, "ln1 and ln2 again, for the weight gradients"},
    {Layer::head, Pass::forward, Exchange::gather, 1, "ln_f, the head's input"},
    {Layer::head, Pass::forward, Exchange::max, 1, "the logits' row maxima"},
    {Layer::head, Pass::forward, Exchange::stats, 1, "the softmax's sums"},
    {Layer::head, Pass::input, Exchange::sum, 1, "ln_f's gradient"},
    {Layer::head, Pass::weight, Exchange::gather, 1, "ln_f again, for the head's gradient"},
};

// Messages of one kind: how many, and the bytes this rank puts in (a sum's or gather's whole rows,
// as the collective is called with them).
struct MessageCount {
  double calls = 0, bytes = 0;
  bool operator==(const MessageCount& o) const { return calls == o.calls && bytes == o.bytes; }
};
using Messages = std::array<MessageCount, kExchanges>;
inline void add(Messages& sum, const Messages& m, double times = 1) {
  for (int k = 0; k < kExchanges; ++k) {
    sum[k].calls += times * m[k].calls;
    sum[k].bytes += times * m[k].bytes;
  }
}
// What `layer`'s `pass` exchanges on a rank of a tensor group of `tp` (nothing at tp 1), on `widths`.
Messages layer_messages(Layer layer, Pass pass, int tp, bool sequence_parallel, const LayerRows& rows,
                        const LayerWidths& widths);

// ---- FLOPs ----

// Floating-point operations of one pass per token row, on `widths`: matrix products (2 per
// multiply-add) and attention (the scores and the weighted sum, over the whole T x T square: the
// causal mask not halving them, as MFU conventionally counts them), the two MFU counts; and other
// work the planner and the partition price (the embedding's additions: no product).
struct PassFlops {
  double gemm = 0, attention = 0, other = 0;
  double model() const { return gemm + attention; }
  double total() const { return model() + other; }
  void add(const PassFlops& f, double times = 1) {
    gemm += times * f.gemm;
    attention += times * f.attention;
    other += times * f.other;
  }
};
PassFlops layer_flops(Layer layer, Pass pass, const LayerWidths& widths, int seq_len);
// The three passes' sum: a training token's forward and backward through one such layer.
PassFlops layer_training_flops(Layer layer, const LayerWidths& widths, int seq_len);

// ---- A chunk's passes, as the executor runs them ----

// forward; backward in one pass; a split backward's input half (B) and weight half (W).
enum class ChunkPass { forward, backward, backward_input, backward_weight };
// Which declared passes of `layer` a chunk pass runs: a backward in one pass runs the input and
// weight halves, and under recompute the forward again first (the blocks' and the head's under
// recompute = block, every layer's under stage; a split backward needs recompute = none).
std::vector<Pass> passes_run(Layer layer, ChunkPass pass, Recompute mode);
// A chunk's blocks: global blocks [begin, end) (which of them are MoE blocks follows from their
// indices, model.moe.every).
struct BlockSpan {
  int begin = 0, end = 0;
  int size() const { return end - begin; }
};
// How many blocks of `span` are dense and how many MoE blocks.
struct BlockKinds {
  int dense = 0, moe = 0;
};
BlockKinds block_kinds(const RunSpec& spec, BlockSpan span);
// What a chunk of `blocks` (with the embedding if first, the head if last) exchanges with its
// tensor group in one pass over a micro-batch, and the FLOPs it computes for one (recompute's
// forwards included: what the kernels count).
Messages chunk_messages(const RunSpec& spec, BlockSpan blocks, bool first, bool last, ChunkPass pass);
PassFlops chunk_flops(const RunSpec& spec, BlockSpan blocks, bool first, bool last, ChunkPass pass);

// A spec's widths, whole and on one tensor rank, for the embedding, the head and `layer` (a dense
// block's, or with Layer::moe_block an MoE block's), and one micro-batch's rows (tp and sequence
// parallelism applied).
LayerWidths whole_widths(const RunSpec& spec, Layer layer = Layer::block);
LayerWidths rank_widths(const RunSpec& spec, Layer layer = Layer::block);
LayerRows micro_batch_rows(const RunSpec& spec);
// The declared buffers' floats of the widest block kind (the stage's scratch serves both), of `table`.
template <class Owner, size_t K>
size_t size_declared_widest(Owner& owner, const BufferDecl<Owner> (&table)[K], const LayerRows& rows,
                            const LayerWidths& dense, const LayerWidths& moe, const BufferContext& ctx) {
  size_t floats = 0;
  for (const BufferDecl<Owner>& d : table) {
    const size_t n = ctx.needs(d.needed) ? std::max(floats_of(d, rows, dense), floats_of(d, rows, moe)) : 0;
    (owner.*d.field).resize(n);
    floats += n;
  }
  return floats;
}
template <class Owner, size_t K>
size_t declared_floats_widest(const BufferDecl<Owner> (&table)[K], const LayerRows& rows, const LayerWidths& dense,
                              const LayerWidths& moe, const BufferContext& ctx) {
  size_t floats = 0;
  for (const BufferDecl<Owner>& d : table)
    if (ctx.needs(d.needed)) floats += std::max(floats_of(d, rows, dense), floats_of(d, rows, moe));
  return floats;
}

}  // namespace pipetrain
