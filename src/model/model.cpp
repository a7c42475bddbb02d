#include "pipetrain/model/model.hpp"

#include <algorithm>
#include <stdexcept>

#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/profile.hpp"
#include "pipetrain/util/clock.hpp"

namespace pipetrain {

size_t Stage::scratch_bytes() const {
  size_t floats = 0;
  auto count = [&](const Floats& v) { floats += v.size(); };
  for_each_declared(scratch_, kStageScratch, count);
  for_each_declared(wscratch_, kBlockWGrads, count);
  for_each_declared(hscratch_, kHeadWGrads, count);
  return sizeof(float) * floats + sizeof(double) * softmax_stats_.size() + work_.bytes() + routing_.bytes();
}

Stage::Stage(const RunSpec& spec, int stage, int n_stages, int block_begin, int block_end, int micro_batches,
             float grad_scale, TpPart tp, TpPart ep)
    : Stage(spec, {{stage, block_begin, block_end}}, n_stages, micro_batches, grad_scale, tp, ep) {}

Stage::Stage(const RunSpec& spec, const std::vector<ChunkRange>& chunks, int n_virtual, int micro_batches,
             float grad_scale, TpPart tp, TpPart ep)
    : M_(micro_batches),
      B_(spec.samples_per_micro_batch()),
      T_(spec.model.seq_len),
      C_(spec.model.d_model),
      tp_(tp),
      sp_(spec.parallel.sequence_parallel && tp.size > 1),
      ep_(ep),
      dispatch_(ep),
      v_begin_(static_cast<int>(part_rows(spec.model.vocab, tp).begin)),
      V_(static_cast<int>(part_rows(spec.model.vocab, tp).size())),
      shape_(tensor_part(block_shape(spec), tp.size)),
      widths_{shape_, static_cast<size_t>(V_)},
      moe_shape_(expert_part(rank_widths(spec, Layer::moe_block).shape, ep.size)),
      moe_widths_{moe_shape_, static_cast<size_t>(V_)},
      moe_(spec.model.moe),
      rope_theta_(static_cast<float>(spec.model.rope_theta)),
      norm_eps_(static_cast<float>(spec.model.norm_eps)),
      q_whole_(block_shape(spec).q),
      kv_whole_(block_shape(spec).kv),
      kv_copies_(heads_replica(block_shape(spec).NKV, tp).size),
      tied_(spec.model.tie_embeddings),
      mode_(spec.parallel.recompute),
      grad_scale_(grad_scale),
      k_(kernels(compute_device(), spec.model.dtype)),
      store_(rank_params(spec, chunks, n_virtual, tp, ep), spec.model.n_layer),
      pool_(chunks, n_virtual, micro_batches) {
  for (const ChunkRange& r : chunks) {
    Chunk c{r.block_end - r.block_begin, r.block_begin, r.vstage == 0, r.vstage == n_virtual - 1, 0, {}};
    for (int i = r.block_begin; i < r.block_end; ++i)
      c.block_offset.push_back(find(block_tensor_name(i, block_tensors(shape_.arch).front()))->offset);
    c.offset = c.first ? 0 : c.block_offset.front();
    chunks_.push_back(std::move(c));
  }
  if (has_embedding()) {
    wte_ = store_.offset_of("wte.weight");
    wpe_ = store_.offset_of("wpe.weight");
  }
  if (has_head()) {
    lnfw_ = store_.offset_of("ln_f.weight");
    lnfb_ = store_.offset_of("ln_f.bias");
    head_ = store_.offset_of(tied_ ? "wte.weight" : "lm_head.weight");
  }

  // One micro-batch's scratch, and a fused backward's output gradients, as layer_decl.hpp declares them.
  const BufferContext fused{has_embedding(), has_head(), false, sp_, tp.size > 1};
  const LayerRows rows = batch_rows();
  size_declared_widest(scratch_, kStageScratch, rows, widths_, moe_widths_, fused);
  size_declared_widest(wscratch_, kBlockWGrads, rows, widths_, moe_widths_, fused);
  size_declared(hscratch_, kHeadWGrads, rows, widths_, fused);
  if (has_head() && tp.size > 1) softmax_stats_.resize(kSplitVocabDoublesPerRow * rows.tokens);
}

const float* Stage::whole_rows(const float* kept, int N) {
  if (!sp_) return kept;
  count_sent(Exchange::gather, sizeof(float) * N * C_);
  group_->all_gather(kept, scratch_.gathered.data(), static_cast<size_t>(kept_rows(N)) * C_);
  return scratch_.gathered.data();
}

const float* Stage::sum_partials(float* partial, int N, float* kept) {
  if (tp_.size > 1) count_sent(Exchange::sum, sizeof(float) * N * C_);
  if (!sp_) {
    if (tp_.size > 1) group_->sum(partial, static_cast<size_t>(N) * C_);
    return partial;
  }
  group_->reduce_scatter(partial, kept, static_cast<size_t>(kept_rows(N)) * C_);
  return kept;
}

BlockPtrs Stage::block_ptrs(Floats& base, const Chunk& c, int l) {
  return block_ptrs_from(base.data() + c.block_offset[l], shape_of(c, l));
}

BlockPtrs Stage::block_weights(const Chunk& c, int l) {
  if (!fetcher_) return block_ptrs(store_.weights(), c, l);
  BlockPtrs b;  // each tensor where the fetcher put it
  size_t offset = c.block_offset[l];
  const BlockShape& shape = shape_of(c, l);
  for (const BlockTensor& t : block_tensors(shape)) {
    if (t.field && held(t, shape)) b.*t.field = fetcher_->where(offset);
    offset += size_of(t, shape);
  }
  return b;
}

void Stage::set_tokens(int mb, const int* tokens) {
  pool_.stash(0, mb).tokens.assign(tokens, static_cast<size_t>(B_) * T_);
}
void Stage::set_targets(int mb, const int* targets) {
  pool_.stash(chunks() - 1, mb).targets.assign(targets, static_cast<size_t>(B_) * T_);
}
void Stage::set_documents(int mb, const int* tokens) {
  if (!mask_.on()) return;
  const size_t n = static_cast<size_t>(B_) * T_;
  std::vector<int> start(n), pos(n);
  for (int b = 0; b < B_; ++b)
    find_documents(tokens + b * T_, T_, 0, 0, mask_, start.data() + b * T_, pos.data() + b * T_);
  documents_.resize(M_);
  documents_[mb].start.assign(start.data(), n);
  if (mask_.restart_positions) documents_[mb].pos.assign(pos.data(), n);
}
Stage::Tokens Stage::micro_batch(int mb) const {
  Tokens tok = micro_batch();
  if (!mask_.on()) return tok;
  tok.doc_start = documents_.at(mb).start.data();
  if (mask_.restart_positions) tok.pos = documents_[mb].pos.data();
  return tok;
}
float* Stage::input_buffer(int chunk, int mb) {
  KernelTimer timer(Kernel::memory);
  auto& xs = pool_.stash(chunk, mb).xs;
  if (xs.empty()) xs.resize(1);
  xs[0].resize(boundary_floats());
  return xs[0].data();
}

void Stage::size_acts(const Chunk& c, Acts& a, const Tokens& tok) {
  KernelTimer timer(Kernel::memory);
  const LayerRows rows = rows_of(tok);
  const BufferContext ctx{c.first, c.last};
  a.xs.resize(c.L + (c.last ? 1 : 0));
  for (auto& x : a.xs) x.resize(rows.kept * C_);
  a.blocks.resize(c.L);
  for (int l = 0; l < c.L; ++l) size_declared(a.blocks[l], kBlockActs, rows, widths_of(c, l), ctx);
  if (c.last) size_declared(a.head, kHeadActs, rows, widths_, ctx);
  a.acts_live = true;
}

// Runs a whole chunk for the micro-batch whose inputs are in `s` (tokens / received input /
// targets), filling every activation of `w` (which may be `s` itself).
void Stage::compute_forward(const Chunk& c, Acts& w, const Acts& s, float* out, double* loss, const Tokens& tok) {
  size_acts(c, w, tok);
  const size_t n_in = boundary_floats();
  if (c.first) {  // tensor ranks: each its vocabulary rows' embeddings, one of them the positions; then summed
    fetch(c, 0, Pass::forward);
    float* embedded = sp_ ? scratch_.attproj.data() : w.xs[0].data();  // every row, before the sum
    k_.encoder_forward(embedded, s.tokens.data(), weight(wte_), tp_.rank == 0 ? weight(wpe_) : nullptr, B_, T_, C_,
                       v_begin_, V_, tok.pos);
    done(c, 0, Pass::forward);
    if (tp_.size > 1) sum_partials(embedded, B_ * T_, w.xs[0].data());
  } else if (&w != &s) copy_values(w.xs[0].data(), s.xs[0].data(), n_in);
  for (int l = 0; l < c.L; ++l) {
    float* y = (l + 1 < c.L || c.last) ? w.xs[l + 1].data() : out;
    fetch(c, l + 1, Pass::forward);
    block_forward(c, l, w.xs[l].data(), w.blocks[l], y, tok);
    done(c, l + 1, Pass::forward);
  }
  if (c.last) {
    fetch(c, c.L + 1, Pass::forward);
    *loss = head_forward(w.xs[c.L].data(), w.head, s.targets.data(), tok);
    done(c, c.L + 1, Pass::forward);
  }
}

std::vector<const ParamTensor*> Stage::layer_params(int chunk, int layer) const {
  const Chunk& c = chunks_[chunk];
  std::vector<size_t> offsets;
  if (layer == 0 && c.first) offsets = {wte_, wpe_};
  if (layer == c.L + 1 && c.last) offsets = {lnfw_, lnfb_, head_};
  const std::string block = "h." + std::to_string(c.block_begin + layer - 1) + ".";
  std::vector<const ParamTensor*> out;
  for (const ParamTensor& p : params()) {
    const bool listed = std::find(offsets.begin(), offsets.end(), p.offset) != offsets.end();
    const bool in_block = layer >= 1 && layer <= c.L && p.name.compare(0, block.size(), block) == 0;
    if (listed || in_block) out.push_back(&p);
  }
  return out;
}

double Stage::forward(int chunk, int mb, float* out) {
  const Chunk& c = chunks_[chunk];
  Acts& s = pool_.stash(chunk, mb);
  double loss = 0;
  const double counted = tp_.rank == 0 ? 1 : 0;  // a tensor group's loss counts once, on its first rank
  const Tokens tok = micro_batch(mb);
  recording_routes_ = true;  // this forward's routing, not a recompute's
  compute_forward(c, mode_ == Recompute::none ? s : work_, s, out, &loss, tok);
  recording_routes_ = false;
  if (mode_ == Recompute::none) return counted * loss;
  if (mode_ == Recompute::block) {  // keep each block's input (and the head's)
    KernelTimer timer(Kernel::memory);
    s.xs.resize(work_.xs.size());
    for (size_t i = 0; i < work_.xs.size(); ++i) {
      s.xs[i].resize(work_.xs[i].size());
      copy_values(s.xs[i].data(), work_.xs[i].data(), work_.xs[i].size());
    }
  }
  // Recompute::stage keeps only what set_tokens / input_buffer / set_targets put in s.
  return counted * loss;
}

void Stage::backward(int chunk, int mb, const float* dout, float* dinp, const std::function<void(size_t)>& done_from) {
  backward_pass(chunk, mb, dout, dinp, BackwardPart::whole, done_from);
}
void Stage::backward_input(int chunk, int mb, const float* dout, float* dinp) {
  backward_pass(chunk, mb, dout, dinp, BackwardPart::input, {});
}
void Stage::backward_weight(int chunk, int mb, const std::function<void(size_t)>& done_from) {
  backward_pass(chunk, mb, nullptr, nullptr, BackwardPart::weight, done_from);
}

// The activations a backward reads: the stash itself (recompute = none), or the work area after
// re-running the whole stage (stage) or with each block's input copied in to re-run one block at a
// time (block: block_backward_step re-runs them).
Acts& Stage::activations_for_backward(const Chunk& c, Acts& s, const Tokens& tok) {
  if (mode_ == Recompute::stage) {
    double unused;
    recompute_s_ -= now_s();
    compute_forward(c, work_, s, scratch_.dx.data(), &unused, tok);  // dx is free scratch at this point
    recompute_s_ += now_s();
    return work_;
  }
  if (mode_ == Recompute::block) {
    size_acts(c, work_, micro_batch());
    for (size_t i = 0; i < s.xs.size(); ++i) copy_values(work_.xs[i].data(), s.xs[i].data(), s.xs[i].size());
    return work_;
  }
  return s;
}

void Stage::head_backward(const Chunk& c, const Acts& s, Acts& a, HeadWGrads& hw, BackwardPart part) {
  const float* x = a.xs[c.L].data();
  if (part != BackwardPart::weight) {
    fetch(c, c.L + 1, Pass::backward);
    if (mode_ == Recompute::block) {
      recompute_s_ -= now_s();
      head_forward(x, a.head, s.targets.data(), micro_batch());
      recompute_s_ += now_s();
    }
    zero_values(scratch_.dres.data(), scratch_.dres.size());
    head_backward_input(x, a.head, s.targets.data(), scratch_.dres.data(), hw, part == BackwardPart::whole);
    done(c, c.L + 1, Pass::backward);
  }
  if (part == BackwardPart::weight) head_backward_weight(x, a.head, hw);
}

// Block l's part of the backward; the input half leaves the gradient of its input in scratch_.dres.
void Stage::block_backward(const Chunk& c, int l, Acts& a, BlockWGrads& w, BackwardPart part, const Tokens& tok) {
  if (part != BackwardPart::weight) {
    fetch(c, l + 1, Pass::backward);
    if (mode_ == Recompute::block) {
      recompute_s_ -= now_s();
      block_forward(c, l, a.xs[l].data(), a.blocks[l], scratch_.dx.data(), tok);
      recompute_s_ += now_s();
    }
    const BlockPtrs g = block_ptrs(store_.grads(), c, l);
    block_backward_input(c, l, a.xs[l].data(), a.blocks[l], scratch_.dres.data(), scratch_.dx.data(), w,
                         part == BackwardPart::whole ? &g : nullptr, tok);
    done(c, l + 1, Pass::backward);
    std::swap(scratch_.dres, scratch_.dx);  // dres now holds the gradient of block l's input
  }
  if (part == BackwardPart::weight) block_backward_weight(c, l, a.xs[l].data(), a.blocks[l], w);
}

// A split backward's output gradients, kept in the micro-batch's slot from B to W (sized at B).
WGrads& Stage::kept_wgrads(const Chunk& c, int chunk, int mb, bool size_them) {
  WGrads& kept = pool_.wgrads(chunk, mb);
  if (size_them) {
    KernelTimer timer(Kernel::memory);
    const BufferContext ctx{c.first, c.last, true};
    kept.blocks.resize(c.L);
    for (int l = 0; l < c.L; ++l) size_declared(kept.blocks[l], kBlockWGrads, batch_rows(), widths_of(c, l), ctx);
    size_declared(kept.head, kHeadWGrads, batch_rows(), widths_, ctx);
  }
  return kept;
}

// The head (last chunk), the blocks from the last, then the embedding (first chunk) or the input's
// gradient out; the weight half reports each layer's gradients final as it passes them.
void Stage::backward_pass(int chunk, int mb, const float* dout, float* dinp, BackwardPart part,
                          const std::function<void(size_t)>& done_from) {
  const Chunk& c = chunks_[chunk];
  const bool input = part != BackwardPart::weight, weight = part != BackwardPart::input;
  const bool split = part != BackwardPart::whole;
  if (split && mode_ != Recompute::none) throw std::logic_error("a split backward needs recompute = none");
  recompute_s_ = 0;
  Acts& s = pool_.stash(chunk, mb);
  const Tokens tok = micro_batch(mb);
  Acts& a = input ? activations_for_backward(c, s, tok) : s;
  WGrads* kept = split ? &kept_wgrads(c, chunk, mb, input) : nullptr;
  HeadWGrads& hw = kept ? kept->head : hscratch_;
  const size_t n = boundary_floats();
  if (c.last) head_backward(c, s, a, hw, part);
  else if (input) copy_values(scratch_.dres.data(), dout, n);
  if (c.last && weight && done_from) done_from(lnfw_);
  for (int l = c.L - 1; l >= 0; --l) {
    block_backward(c, l, a, kept ? kept->blocks[l] : wscratch_, part, tok);
    if (weight && done_from && l > 0) done_from(c.block_offset[l]);
  }
  if (c.first) {
    if (split && input) copy_values(hw.dembed.data(), scratch_.dres.data(), n);
    if (weight)  // every token's row: this rank's vocabulary rows may be any rank's tokens
      k_.encoder_backward(store_.grads().data() + wte_, tensor(store_.grads(), wpe_),
                          whole_rows(split ? hw.dembed.data() : scratch_.dres.data(), B_ * T_), s.tokens.data(), B_, T_,
                          C_, v_begin_, V_, tok.pos);
  } else if (input) {
    copy_values(dinp, scratch_.dres.data(), n);
  }
  if (weight) {
    if (done_from) done_from(c.offset);
    pool_.release(chunk, mb);
  }
}

size_t Stage::stash_bytes(int chunk, int mb) const { return pool_.bytes(chunk, mb); }

}  // namespace pipetrain
