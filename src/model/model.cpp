#include "pipetrain/model/model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <tuple>

#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/profile.hpp"
#include "pipetrain/schedule/actions.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/rng.hpp"

namespace pipetrain {
namespace {

// N(0, std) values for one named tensor from a stream seeded by (seed, name): a tensor gets the
// same values whichever stage or layout owns it.
void fill_normal(float* out, size_t n, float stddev, uint64_t seed, const std::string& name) {
  uint64_t state = seed * 0x100000001b3ULL;
  for (unsigned char c : name) state = (state ^ c) * 0x100000001b3ULL;
  SplitMix64 rng{state};
  for (size_t i = 0; i < n; i += 2) {
    double u1 = ((rng.next() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = rng.uniform();
    double r = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * M_PI * u2;
    out[i] = static_cast<float>(stddev * r * std::cos(th));
    if (i + 1 < n) out[i + 1] = static_cast<float>(stddev * r * std::sin(th));
  }
}

// A tensor rank's part of what fill_normal gives the whole tensor: the same weights on any tp.
void fill_part_normal(const ParamTensor& p, float* out, float stddev, uint64_t seed) {
  if (!p.split()) return fill_normal(out, p.size, stddev, seed, p.name);
  std::vector<float> all(p.tp.whole_size());
  fill_normal(all.data(), all.size(), stddev, seed, p.name);
  take_part(p.tp, p.shape, all.data(), out);
}

}  // namespace

size_t Acts::bytes() const {
  size_t n = (tokens.size() + targets.size()) * sizeof(int);
  auto count = [&](const Floats& v) { n += v.size() * sizeof(float); };
  for (auto& x : xs) count(x);
  if (acts_live) {
    for (auto& b : blocks) for_each_declared(b, kBlockActs, count);
    for_each_declared(head, kHeadActs, count);
  }
  return n;
}

size_t Stage::scratch_bytes() const {
  size_t floats = 0;
  auto count = [&](const Floats& v) { floats += v.size(); };
  for_each_declared(scratch_, kStageScratch, count);
  for_each_declared(wscratch_, kBlockWGrads, count);
  for_each_declared(hscratch_, kHeadWGrads, count);
  return sizeof(float) * floats + sizeof(double) * softmax_stats_.size() + work_.bytes();
}

size_t WGrads::bytes() const {
  size_t n = 0;
  auto count = [&](const Floats& v) { n += v.size() * sizeof(float); };
  for (auto& w : blocks) for_each_declared(w, kBlockWGrads, count);
  for_each_declared(head, kHeadWGrads, count);
  return n;
}

void WGrads::release() {
  for (auto& w : blocks) for_each_declared(w, kBlockWGrads, [](Floats& v) { v.clear(); });
  for_each_declared(head, kHeadWGrads, [](Floats& v) { v.clear(); });
}

void Acts::release() {
  tokens.clear();
  targets.clear();
  for (auto& x : xs) x.clear();
  acts_live = false;
}

std::vector<ParamTensor> stage_params(const RunSpec& spec, int stage, int n_stages, int block_begin, int block_end,
                                      TpPart tp) {
  const int C = spec.model.d_model, V = spec.model.vocab, T = spec.model.seq_len;
  const BlockShape whole = block_shape(spec), shape = tensor_part(whole, tp.size);
  const int V_part = static_cast<int>(part_rows(V, tp).size());
  const bool gpt2 = !shape.llama();  // learned positions and a norm with a bias
  const bool first = stage == 0, last = stage == n_stages - 1;
  const bool sequence_parallel = spec.parallel.sequence_parallel && tp.size > 1;
  std::vector<ParamTensor> params;
  size_t offset = 0;
  // `split`: the whole tensor's shape, the split axis and its groups, when tensor ranks split it.
  auto add = [&](const std::string& name, std::vector<int> shape, bool decay, Init init, bool tied_copy = false,
                 TpSlice split = {}) {
    ParamTensor p;
    p.name = name;
    p.init = init;
    p.size = 1;
    for (int d : shape) p.size *= static_cast<size_t>(d);
    p.tp = std::move(split);
    if (p.tp.axis < 0) {  // whole on every tensor rank
      p.tp.whole = shape;
      p.tp.part = p.tp.replica = tp;
    }
    p.shape = std::move(shape);
    p.offset = offset;
    p.decay = decay;
    p.tied_copy = tied_copy;
    offset += p.size;
    params.push_back(std::move(p));
  };
  const TpSlice vocab_rows{{V, C}, 0, {V}, tp, {}};  // wte and the LM head: the vocabulary's rows
  if (first) {
    add("wte.weight", {V_part, C}, true, Init::normal, false, vocab_rows);
    if (gpt2) add("wpe.weight", {T, C}, true, Init::normal);
  }
  for (int i = block_begin; i < block_end; ++i)
    for (const BlockTensor& t : block_tensors(shape.arch)) {
      TpSlice split;
      if (tp.size > 1 && (split_by_tp(t.rows) || split_by_tp(t.cols))) {
        const Dim d = split_by_tp(t.rows) ? t.rows : t.cols;
        const bool kv = d == Dim::kv;  // a key/value head may be held by several ranks
        split = {shape_of(t, whole), split_by_tp(t.rows) ? 0 : 1, split_groups(d, whole),
                 kv ? heads_part(whole.NKV, tp) : tp, kv ? heads_replica(whole.NKV, tp) : TpPart{}};
      }
      add(block_tensor_name(i, t), shape_of(t, shape), t.decay, t.init, false, split);
      const bool norm = t.field == &BlockPtrs::ln1w || t.field == &BlockPtrs::ln1b || t.field == &BlockPtrs::ln2w ||
                        t.field == &BlockPtrs::ln2b;
      params.back().sums_over_tokens = norm && sequence_parallel;
    }
  if (last) {
    add("ln_f.weight", {C}, false, Init::ones);
    params.back().sums_over_tokens = sequence_parallel;
    if (gpt2) {
      add("ln_f.bias", {C}, false, Init::zeros);
      params.back().sums_over_tokens = sequence_parallel;
    }
    if (!spec.model.tie_embeddings) add("lm_head.weight", {V_part, C}, true, Init::normal, false, vocab_rows);
    else if (!first) add("wte.weight", {V_part, C}, true, Init::normal, /*tied_copy=*/true, vocab_rows);
  }
  if (tp.size == 1)
    for (ParamTensor& p : params) p.tp.axis = -1;  // one rank holds everything whole
  return params;
}

std::vector<ParamTensor> rank_params(const RunSpec& spec, const std::vector<ChunkRange>& chunks, int n_virtual,
                                     TpPart tp) {
  std::vector<ParamTensor> params;
  for (const ChunkRange& c : chunks) {
    const size_t offset = params.empty() ? 0 : params.back().offset + params.back().size;
    size_t dropped = 0;  // a tied head's copy of wte, on the rank that holds wte itself (a vee)
    for (ParamTensor& p : stage_params(spec, c.vstage, n_virtual, c.block_begin, c.block_end, tp)) {
      if (p.tied_copy && std::any_of(params.begin(), params.end(), [&](auto& q) { return q.name == p.name; })) {
        dropped += p.size;
        continue;
      }
      p.offset += offset - dropped;
      params.push_back(std::move(p));
    }
  }
  return params;
}

Stage::Stage(const RunSpec& spec, int stage, int n_stages, int block_begin, int block_end, int micro_batches,
             float grad_scale, TpPart tp)
    : Stage(spec, {{stage, block_begin, block_end}}, n_stages, micro_batches, grad_scale, tp) {}

Stage::Stage(const RunSpec& spec, const std::vector<ChunkRange>& chunks, int n_virtual, int micro_batches,
             float grad_scale, TpPart tp)
    : M_(micro_batches),
      B_(spec.samples_per_micro_batch()),
      T_(spec.model.seq_len),
      C_(spec.model.d_model),
      n_layer_(spec.model.n_layer),
      tp_(tp),
      sp_(spec.parallel.sequence_parallel && tp.size > 1),
      v_begin_(static_cast<int>(part_rows(spec.model.vocab, tp).begin)),
      V_(static_cast<int>(part_rows(spec.model.vocab, tp).size())),
      shape_(tensor_part(block_shape(spec), tp.size)),
      widths_{shape_, static_cast<size_t>(V_)},
      rope_theta_(static_cast<float>(spec.model.rope_theta)),
      norm_eps_(static_cast<float>(spec.model.norm_eps)),
      tied_(spec.model.tie_embeddings),
      mode_(spec.parallel.recompute),
      grad_scale_(grad_scale),
      k_(kernels(compute_device(), spec.model.dtype)) {
  params_ = rank_params(spec, chunks, n_virtual, tp);
  const size_t total = params_.empty() ? 0 : params_.back().offset + params_.back().size;
  weights_.resize(total);
  grads_.resize(total);
  for (const ChunkRange& r : chunks) {
    Chunk c{r.block_end - r.block_begin, r.vstage == 0, r.vstage == n_virtual - 1, 0, {}};
    for (int i = r.block_begin; i < r.block_end; ++i)
      c.block_offset.push_back(find(block_tensor_name(i, block_tensors(shape_.arch).front()))->offset);
    c.offset = c.first ? 0 : c.block_offset.front();
    chunks_.push_back(std::move(c));
  }
  if (has_embedding()) {
    wte_ = find("wte.weight")->offset;
    if (const ParamTensor* wpe = find("wpe.weight")) wpe_ = wpe->offset;
  }
  if (has_head()) {
    lnfw_ = find("ln_f.weight")->offset;
    if (const ParamTensor* lnfb = find("ln_f.bias")) lnfb_ = lnfb->offset;
    head_ = find(tied_ ? "wte.weight" : "lm_head.weight")->offset;
  }

  slot_of_.assign(static_cast<size_t>(micro_batches) * chunks.size(), -1);
  wslot_of_ = slot_of_;
  pool_of_ = buffer_pools(chunks, n_virtual);
  const size_t n_pools = *std::max_element(pool_of_.begin(), pool_of_.end()) + 1;
  acts_pools_ = std::vector<Pool<Acts>>(n_pools);  // built in place: a pool's deque cannot move without throwing
  wgrad_pools_ = std::vector<Pool<WGrads>>(n_pools);
  // One micro-batch's scratch, and a fused backward's output gradients, as layer_decl.hpp declares them.
  const BufferContext fused{has_embedding(), has_head(), false, sp_, tp.size > 1};
  const LayerRows rows = batch_rows();
  size_declared(scratch_, kStageScratch, rows, widths_, fused);
  size_declared(wscratch_, kBlockWGrads, rows, widths_, fused);
  size_declared(hscratch_, kHeadWGrads, rows, widths_, fused);
  if (has_head() && tp.size > 1) softmax_stats_.resize(kSplitVocabDoublesPerRow * rows.tokens);
}

const ParamTensor* Stage::find(const std::string& name) const {
  for (auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

void Stage::init_params(uint64_t seed) {
  const float resid_std = 0.02f / std::sqrt(2.f * n_layer_);
  std::vector<float> host(weights_.size());
  for (auto& p : params_) {
    float* w = host.data() + p.offset;
    switch (p.init) {
      case Init::zeros:
        std::fill(w, w + p.size, 0.f);
        break;
      case Init::ones:
        std::fill(w, w + p.size, 1.f);
        break;
      case Init::normal:
      case Init::residual_normal:
        fill_part_normal(p, w, p.init == Init::normal ? 0.02f : resid_std, seed);
        break;
    }
  }
  weights_.assign(host.data(), host.size());
}

void Stage::zero_grads() { zero_values(grads_.data(), grads_.size()); }

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
  return block_ptrs_from(base.data() + c.block_offset[l], shape_);
}

void Stage::set_tokens(int mb, const int* tokens) { stash(0, mb).tokens.assign(tokens, static_cast<size_t>(B_) * T_); }
void Stage::set_targets(int mb, const int* targets) {
  stash(chunks() - 1, mb).targets.assign(targets, static_cast<size_t>(B_) * T_);
}
float* Stage::input_buffer(int chunk, int mb) {
  KernelTimer timer(Kernel::memory);
  auto& xs = stash(chunk, mb).xs;
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
  for (auto& b : a.blocks) size_declared(b, kBlockActs, rows, widths_, ctx);
  if (c.last) size_declared(a.head, kHeadActs, rows, widths_, ctx);
  a.acts_live = true;
}

// Runs a whole chunk for the micro-batch whose inputs are in `s` (tokens / received input /
// targets), filling every activation of `w` (which may be `s` itself).
void Stage::compute_forward(const Chunk& c, Acts& w, const Acts& s, float* out, double* loss) {
  size_acts(c, w, micro_batch());
  const size_t n_in = boundary_floats();
  if (c.first) {  // tensor ranks: each its vocabulary rows' embeddings, one of them the positions; then summed
    float* embedded = sp_ ? scratch_.attproj.data() : w.xs[0].data();  // every row, before the sum
    k_.encoder_forward(embedded, s.tokens.data(), weights_.data() + wte_,
                       tp_.rank == 0 ? tensor(weights_, wpe_) : nullptr, B_, T_, C_, v_begin_, V_);
    if (tp_.size > 1) sum_partials(embedded, B_ * T_, w.xs[0].data());
  } else if (&w != &s) copy_values(w.xs[0].data(), s.xs[0].data(), n_in);
  for (int l = 0; l < c.L; ++l) {
    float* y = (l + 1 < c.L || c.last) ? w.xs[l + 1].data() : out;
    block_forward(c, l, w.xs[l].data(), w.blocks[l], y, micro_batch());
  }
  if (c.last) *loss = head_forward(w.xs[c.L].data(), w.head, s.targets.data(), micro_batch());
}

double Stage::forward(int chunk, int mb, float* out) {
  const Chunk& c = chunks_[chunk];
  Acts& s = stash(chunk, mb);
  double loss = 0;
  const double counted = tp_.rank == 0 ? 1 : 0;  // a tensor group's loss counts once, on its first rank
  if (mode_ == Recompute::none) {
    compute_forward(c, s, s, out, &loss);
    return counted * loss;
  }
  compute_forward(c, work_, s, out, &loss);
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
  backward_pass(chunk, mb, dout, dinp, true, true, done_from);
}
void Stage::backward_input(int chunk, int mb, const float* dout, float* dinp) {
  backward_pass(chunk, mb, dout, dinp, true, false, {});
}
void Stage::backward_weight(int chunk, int mb, const std::function<void(size_t)>& done_from) {
  backward_pass(chunk, mb, nullptr, nullptr, false, true, done_from);
}

// input: the input-gradient half (B); weight: the parameter-gradient half (W). Both at once is a
// fused backward, each kernel doing both halves in one pass, with one scratch set of output
// gradients; one at a time (recompute = none only) keeps those in mb's stash between the halves.
void Stage::backward_pass(int chunk, int mb, const float* dout, float* dinp, bool input, bool weight,
                          const std::function<void(size_t)>& done_from) {
  const Chunk& c = chunks_[chunk];
  const int L = c.L;
  Acts& s = stash(chunk, mb);
  Acts* a = &s;
  const bool split = input != weight;
  if (split && mode_ != Recompute::none) throw std::logic_error("a split backward needs recompute = none");
  recompute_s_ = 0;
  if (mode_ == Recompute::stage) {
    double unused;
    recompute_s_ -= now_s();
    compute_forward(c, work_, s, scratch_.dx.data(), &unused);  // scratch_.dx is free scratch at this point
    recompute_s_ += now_s();
    a = &work_;
  } else if (mode_ == Recompute::block) {
    size_acts(c, work_, micro_batch());
    for (size_t i = 0; i < s.xs.size(); ++i) copy_values(work_.xs[i].data(), s.xs[i].data(), s.xs[i].size());
    a = &work_;
  }
  const size_t n = boundary_floats();
  WGrads* kept = split ? &wgrads(chunk, mb) : nullptr;
  if (split && input) {
    KernelTimer timer(Kernel::memory);
    const BufferContext ctx{c.first, c.last, true};
    kept->blocks.resize(L);
    for (auto& w : kept->blocks) size_declared(w, kBlockWGrads, batch_rows(), widths_, ctx);
    size_declared(kept->head, kHeadWGrads, batch_rows(), widths_, ctx);
  }
  HeadWGrads& hw = split ? kept->head : hscratch_;
  if (c.last) {
    if (input) {
      if (mode_ == Recompute::block) {
        recompute_s_ -= now_s();
        head_forward(a->xs[L].data(), a->head, s.targets.data(), micro_batch());
        recompute_s_ += now_s();
      }
      zero_values(scratch_.dres.data(), scratch_.dres.size());
      head_backward_input(a->xs[L].data(), a->head, s.targets.data(), scratch_.dres.data(), hw, !split);
    }
    if (weight) {
      if (split) head_backward_weight(a->xs[L].data(), a->head, hw);
      if (done_from) done_from(lnfw_);
    }
  } else if (input) {
    copy_values(scratch_.dres.data(), dout, n);
  }
  for (int l = L - 1; l >= 0; --l) {
    BlockWGrads& w = split ? kept->blocks[l] : wscratch_;
    if (input) {
      if (mode_ == Recompute::block) {
        recompute_s_ -= now_s();
        block_forward(c, l, a->xs[l].data(), a->blocks[l], scratch_.dx.data(), micro_batch());
        recompute_s_ += now_s();
      }
      const BlockPtrs g = block_ptrs(grads_, c, l);
      block_backward_input(c, l, a->xs[l].data(), a->blocks[l], scratch_.dres.data(), scratch_.dx.data(), w,
                           split ? nullptr : &g);
      std::swap(scratch_.dres, scratch_.dx);  // scratch_.dres now holds the gradient of block l's input
    }
    if (weight) {
      if (split) block_backward_weight(c, l, a->xs[l].data(), a->blocks[l], w);
      if (done_from && l > 0) done_from(c.block_offset[l]);
    }
  }
  if (c.first) {
    if (split && input) copy_values(hw.dembed.data(), scratch_.dres.data(), n);
    if (weight)  // every token's row: this rank's vocabulary rows may be any rank's tokens
      k_.encoder_backward(grads_.data() + wte_, tensor(grads_, wpe_),
                          whole_rows(split ? hw.dembed.data() : scratch_.dres.data(), B_ * T_), s.tokens.data(), B_, T_,
                          C_, v_begin_, V_);
  } else if (input) {
    copy_values(dinp, scratch_.dres.data(), n);
  }
  if (weight) {
    if (done_from) done_from(c.offset);
    release(chunk, mb);
  }
}

template <class T>
T& Stage::take(std::vector<Pool<T>>& pools, int pool, int& slot) {
  Pool<T>& p = pools[pool];
  if (slot < 0) {
    if (p.free.empty()) {
      p.free.push_back(static_cast<int>(p.slots.size()));
      p.slots.emplace_back();
    }
    slot = p.free.back();
    p.free.pop_back();
  }
  return p.slots[slot];
}

template <class T>
void Stage::give_back(std::vector<Pool<T>>& pools, int pool, int& slot) {
  if (slot < 0) return;
  pools[pool].slots[slot].release();
  pools[pool].free.push_back(slot);
  slot = -1;
}

Acts& Stage::stash(int chunk, int mb) { return take(acts_pools_, pool_of_[chunk], slot_of_[key(chunk, mb)]); }

WGrads& Stage::wgrads(int chunk, int mb) { return take(wgrad_pools_, pool_of_[chunk], wslot_of_[key(chunk, mb)]); }

void Stage::release(int chunk, int mb) {
  give_back(acts_pools_, pool_of_[chunk], slot_of_[key(chunk, mb)]);
  give_back(wgrad_pools_, pool_of_[chunk], wslot_of_[key(chunk, mb)]);
}

size_t Stage::stash_bytes(int chunk, int mb) const {
  const int pool = pool_of_[chunk], slot = slot_of_[key(chunk, mb)], wslot = wslot_of_[key(chunk, mb)];
  return (slot < 0 ? 0 : acts_pools_[pool].slots[slot].bytes()) +
         (wslot < 0 ? 0 : wgrad_pools_[pool].slots[wslot].bytes());
}

}  // namespace pipetrain
