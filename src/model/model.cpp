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

// Visits every activation buffer of a block / the head (const or not).
template <class Block, class F>
void for_each_block_buffer(Block& a, F f) {
  for (auto* v : {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.lse, &a.atty, &a.res2, &a.ln2, &a.ln2_mean, &a.ln2_rstd,
                  &a.fch, &a.fch_gelu})
    f(*v);
}
template <class Head, class F>
void for_each_head_buffer(Head& a, F f) {
  for (auto* v : {&a.lnf, &a.lnf_mean, &a.lnf_rstd, &a.probs}) f(*v);
}
template <class W, class F>
void for_each_wgrad_buffer(W& w, F f) {
  for (auto* v : {&w.dout, &w.dfch, &w.dln2, &w.dres2, &w.dqkv, &w.dln1}) f(*v);
}
template <class W, class F>
void for_each_head_wgrad_buffer(W& w, F f) {
  for (auto* v : {&w.dlogits, &w.dlnf, &w.dembed}) f(*v);
}
// N token rows, R of them kept (sequence parallelism; else N). keep_copies: also the block's output
// and d(res2) gradients, all N rows, which only a split backward keeps (a fused one reads them
// where they already are).
void size_wgrads(BlockWGrads& w, const BlockShape& s, size_t N, size_t R, bool keep_copies) {
  KernelTimer timer(Kernel::memory);
  w.dfch.resize(N * s.fc);
  w.dln2.resize(R * s.C);
  w.dqkv.resize(N * s.qkv);
  w.dln1.resize(R * s.C);
  if (keep_copies) {
    w.dout.resize(N * s.C);
    w.dres2.resize(N * s.C);
  }
}

// A tensor rank's block widths and the most vocabulary rows any rank of the group holds: what the
// memory formulas count per rank.
BlockShape rank_shape(const RunSpec& spec) { return tensor_part(block_shape(spec), spec.parallel.tp); }
size_t rank_vocab(const RunSpec& spec) {
  return (static_cast<size_t>(spec.model.vocab) + spec.parallel.tp - 1) / spec.parallel.tp;
}
// Of a micro-batch's token rows, those a rank keeps of the residual stream and the norms: all,
// or with sequence parallelism its tp-th.
size_t kept_token_rows(const RunSpec& spec) {
  const size_t n = static_cast<size_t>(spec.samples_per_micro_batch()) * spec.model.seq_len;
  return spec.parallel.sequence_parallel && spec.parallel.tp > 1 ? n / spec.parallel.tp : n;
}

}  // namespace

size_t stash_bytes_per_micro_batch(const RunSpec& spec, int stage, int n_stages, int blocks, Recompute mode) {
  const size_t b = spec.samples_per_micro_batch(), T = spec.model.seq_len, C = spec.model.d_model;
  const BlockShape s = rank_shape(spec);
  const size_t NH = s.NH, V = rank_vocab(spec), n = b * T, R = kept_token_rows(spec), L = blocks;
  // 16C+4 floats a token for gpt2 on one rank: the kept rows' 4C + 2 norm_stats, every row's products
  const size_t kept_per_row = 4 * C + 2 * s.norm_stats, all_per_row = s.q + s.qkv + s.fc + s.ffn;
  const bool first = stage == 0, last = stage == n_stages - 1;
  size_t floats = 0;
  if (mode == Recompute::none)
    floats = L * (R * kept_per_row + n * all_per_row + b * NH * T) + (last ? R * (2 * C + s.norm_stats) + n * V : 0);
  if (mode == Recompute::block) floats = R * C * (L + (last ? 1 : 0));
  if (mode == Recompute::stage) floats = first ? 0 : R * C;
  const size_t ints = n * ((first ? 1 : 0) + (last ? 1 : 0));
  return sizeof(float) * floats + sizeof(int) * ints;
}

size_t wgrad_bytes_per_micro_batch(const RunSpec& spec, int stage, int n_stages, int blocks) {
  const size_t n = static_cast<size_t>(spec.samples_per_micro_batch()) * spec.model.seq_len, C = spec.model.d_model;
  const BlockShape s = rank_shape(spec);
  const bool first = stage == 0, last = stage == n_stages - 1;
  const size_t R = kept_token_rows(spec);  // d(ln2), d(ln1), the head's d(lnf) and the input's: kept rows
  return sizeof(float) * (n * (2 * C + s.qkv + s.fc) * blocks + R * 2 * C * blocks +
                          (last ? n * rank_vocab(spec) + R * C : 0) + (first ? R * C : 0));
}

namespace {
// The kernels' own scratch, kept from call to call (what the GPU's scratch slots grow to, each
// counted whole even where two share a slot). On the CPU: each compute thread's attention blocks.
// On the GPU: attention's dout . out per row of the rank's heads; the loss's row sums (double) on
// the last stage; on the first the embedding gradient's sort of token positions by row (four int
// arrays and the sort's own storage, about two more, and its histograms); two slots of column
// partial sums (the norms' and biases' gradients, one float per 256 rows and column); and under
// bf16 the bf16 copies of the matrix products' operands, three buffers each as large as the
// largest operand of its kind (a weight, an input, an output gradient: the head's [tokens,
// vocabulary part] on the last stage).
size_t kernel_scratch_bytes(const RunSpec& spec, const BlockShape& s, bool first, bool last) {
  const size_t b = spec.samples_per_micro_batch(), T = spec.model.seq_len, n = b * T, C = s.C;
  if (spec.run.device == Device::cpu)
    return std::max(1, spec.parallel.threads_per_rank) *
           attention_scratch_bytes(static_cast<int>(T), s.head_dim, s.NH / s.NKV);
  const size_t widest = std::max<size_t>({C, static_cast<size_t>(s.qkv), static_cast<size_t>(s.fc)});
  size_t bytes =
      4 * b * s.NH * T + (last ? 8 * n : 0) + (first ? 24 * n + (64 << 10) : 0) + 2 * 4 * ((n + 255) / 256) * widest;
  if (spec.model.dtype == Dtype::bf16) {
    const size_t V = last ? rank_vocab(spec) : 0, q = s.q, qkv = s.qkv, fc = s.fc, ffn = s.ffn;
    const size_t weight = std::max({qkv, q, fc, ffn, V}) * C, inp = n * std::max({C, q, ffn});
    bytes += 2 * (weight + inp + n * std::max({qkv, C, fc, V}));
  }
  return bytes;
}
}  // namespace

size_t working_bytes(const RunSpec& spec, const std::vector<ChunkRange>& chunks, int n_virtual) {
  const size_t b = spec.samples_per_micro_batch(), T = spec.model.seq_len, C = spec.model.d_model;
  const size_t n = b * T, V = rank_vocab(spec);
  const bool last = std::any_of(chunks.begin(), chunks.end(), [&](auto& c) { return c.vstage == n_virtual - 1; });
  const bool first = std::any_of(chunks.begin(), chunks.end(), [&](auto& c) { return c.vstage == 0; });
  const ChunkPlacement placement = spec.chunk_placement();
  const size_t links = message_links(placement, placement.stage_of(chunks.front().vstage)).size();
  const BlockShape s = rank_shape(spec);
  const bool split_vocab = spec.parallel.tp > 1;
  const size_t R = kept_token_rows(spec);
  size_t floats = n * (2 * C + s.q + s.ffn) + R * 2 * C  // attproj, fcproj, datty, the activation's gradient; dres, dx
                  + n * (s.fc + s.qkv) + R * 2 * C       // the output gradients a fused block backward passes on
                  + (last ? 2 * n * V + R * C : 0)       // logits; the head's output gradients
                  + (last && split_vocab ? 5 * n : 0)    // a split vocabulary's row maxima and (double) sums
                  + (R < n ? 2 * n * C + R * C : 0)      // sequence parallelism: gathered rows, a partial, summed rows
                  + kMessageRing * links * R * C;        // the executor's rings, one per message link
  size_t bytes = sizeof(float) * floats + kernel_scratch_bytes(spec, s, first, last), work = 0;
  if (spec.parallel.recompute != Recompute::none)  // Stage::work_: one micro-batch's
    for (const ChunkRange& c : chunks) {           // activations, without its inputs
      const int ints = (c.vstage == 0 ? 1 : 0) + (c.vstage == n_virtual - 1 ? 1 : 0);
      work = std::max(
          work, stash_bytes_per_micro_batch(spec, c.vstage, n_virtual, c.block_end - c.block_begin, Recompute::none) -
                    sizeof(int) * n * ints);
    }
  return bytes + work;
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

size_t Acts::bytes() const {
  size_t n = (tokens.size() + targets.size()) * sizeof(int);
  auto count = [&](const Floats& v) { n += v.size() * sizeof(float); };
  for (auto& x : xs) count(x);
  if (acts_live) {
    for (auto& b : blocks) for_each_block_buffer(b, count);
    for_each_head_buffer(head, count);
  }
  return n;
}

size_t WGrads::bytes() const {
  size_t n = 0;
  auto count = [&](const Floats& v) { n += v.size() * sizeof(float); };
  for (auto& w : blocks) for_each_wgrad_buffer(w, count);
  for_each_head_wgrad_buffer(head, count);
  return n;
}

void WGrads::release() {
  for (auto& w : blocks) for_each_wgrad_buffer(w, [](Floats& v) { v.clear(); });
  for_each_head_wgrad_buffer(head, [](Floats& v) { v.clear(); });
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
  const size_t N = static_cast<size_t>(B_) * T_, C = C_, R = kept_rows(B_ * T_);
  attproj_.resize(N * C);
  fcproj_.resize(N * C);
  dres_.resize(R * C);
  dx_.resize(R * C);
  datty_.resize(N * shape_.q);
  dfch_gelu_.resize(N * shape_.ffn);
  if (sp_) {
    gathered_.resize(N * C);
    dpartial_.resize(N * C);
    summed_.resize(R * C);
  }
  size_wgrads(wscratch_, shape_, N, R, false);
  if (has_head()) {
    logits_.resize(N * V_);
    hscratch_.dlogits.resize(N * V_);
    hscratch_.dlnf.resize(R * C);
    if (tp.size > 1) {
      row_max_.resize(N);
      softmax_stats_.resize(2 * N);
    }
  }
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
  group_->all_gather(kept, gathered_.data(), static_cast<size_t>(kept_rows(N)) * C_);
  return gathered_.data();
}

const float* Stage::sum_partials(float* partial, int N, float* kept) {
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
  const size_t N = tok.rows(), C = C_, R = kept_rows(tok.rows());
  a.xs.resize(c.L + (c.last ? 1 : 0));
  for (auto& x : a.xs) x.resize(R * C);
  a.blocks.resize(c.L);
  for (auto& b : a.blocks) {
    b.ln1.resize(R * C);
    const size_t means = shape_.norm_stats == 2 ? R : 0;  // RMSNorm keeps none
    b.ln1_mean.resize(means);
    b.ln1_rstd.resize(R);
    b.qkv.resize(N * shape_.qkv);
    b.lse.resize(tok.cache ? 0 : static_cast<size_t>(tok.B) * shape_.NH * tok.T);  // generation keeps none
    b.atty.resize(N * shape_.q);
    b.res2.resize(R * C);
    b.ln2.resize(R * C);
    b.ln2_mean.resize(means);
    b.ln2_rstd.resize(R);
    b.fch.resize(N * shape_.fc);
    b.fch_gelu.resize(N * shape_.ffn);
  }
  if (c.last) {
    a.head.lnf.resize(R * C);
    a.head.lnf_mean.resize(shape_.norm_stats == 2 ? R : 0);
    a.head.lnf_rstd.resize(R);
    a.head.probs.resize(N * V_);
  }
  a.acts_live = true;
}

// Runs a whole chunk for the micro-batch whose inputs are in `s` (tokens / received input /
// targets), filling every activation of `w` (which may be `s` itself).
void Stage::compute_forward(const Chunk& c, Acts& w, const Acts& s, float* out, double* loss) {
  size_acts(c, w, micro_batch());
  const size_t n_in = boundary_floats();
  if (c.first) {  // tensor ranks: each its vocabulary rows' embeddings, one of them the positions; then summed
    float* embedded = sp_ ? attproj_.data() : w.xs[0].data();  // every row, before the sum
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
    compute_forward(c, work_, s, dx_.data(), &unused);  // dx_ is free scratch at this point
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
    kept->blocks.resize(L);
    for (auto& w : kept->blocks) size_wgrads(w, shape_, static_cast<size_t>(B_) * T_, kept_rows(B_ * T_), true);
    if (c.last) {
      kept->head.dlogits.resize(static_cast<size_t>(B_) * T_ * V_);
      kept->head.dlnf.resize(n);
    }
    if (c.first) kept->head.dembed.resize(n);
  }
  HeadWGrads& hw = split ? kept->head : hscratch_;
  if (c.last) {
    if (input) {
      if (mode_ == Recompute::block) {
        recompute_s_ -= now_s();
        head_forward(a->xs[L].data(), a->head, s.targets.data(), micro_batch());
        recompute_s_ += now_s();
      }
      zero_values(dres_.data(), dres_.size());
      head_backward_input(a->xs[L].data(), a->head, s.targets.data(), dres_.data(), hw, !split);
    }
    if (weight) {
      if (split) head_backward_weight(a->xs[L].data(), a->head, hw);
      if (done_from) done_from(lnfw_);
    }
  } else if (input) {
    copy_values(dres_.data(), dout, n);
  }
  for (int l = L - 1; l >= 0; --l) {
    BlockWGrads& w = split ? kept->blocks[l] : wscratch_;
    if (input) {
      if (mode_ == Recompute::block) {
        recompute_s_ -= now_s();
        block_forward(c, l, a->xs[l].data(), a->blocks[l], dx_.data(), micro_batch());
        recompute_s_ += now_s();
      }
      const BlockPtrs g = block_ptrs(grads_, c, l);
      block_backward_input(c, l, a->xs[l].data(), a->blocks[l], dres_.data(), dx_.data(), w, split ? nullptr : &g);
      std::swap(dres_, dx_);  // dres_ now holds the gradient of block l's input
    }
    if (weight) {
      if (split) block_backward_weight(c, l, a->xs[l].data(), a->blocks[l], w);
      if (done_from && l > 0) done_from(c.block_offset[l]);
    }
  }
  if (c.first) {
    if (split && input) copy_values(hw.dembed.data(), dres_.data(), n);
    if (weight)  // every token's row: this rank's vocabulary rows may be any rank's tokens
      k_.encoder_backward(grads_.data() + wte_, tensor(grads_, wpe_),
                          whole_rows(split ? hw.dembed.data() : dres_.data(), B_ * T_), s.tokens.data(), B_, T_, C_,
                          v_begin_, V_);
  } else if (input) {
    copy_values(dinp, dres_.data(), n);
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
