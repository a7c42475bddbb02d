#include "pipetrain/model/param_store.hpp"

#include <algorithm>
#include <cmath>

#include "pipetrain/compute/kernels.hpp"
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

std::vector<ParamTensor> stage_params(const RunSpec& spec, int stage, int n_stages, int block_begin, int block_end,
                                      TpPart tp, TpPart ep) {
  const int C = spec.model.d_model, V = spec.model.vocab, T = spec.model.seq_len;
  const int V_part = static_cast<int>(part_rows(V, tp).size());
  const bool gpt2 = spec.model.arch == Arch::gpt2;  // learned positions and a norm with a bias
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
    if (p.tp.axis < 0 && p.tp.whole.empty()) {  // whole on every tensor rank
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
  for (int i = block_begin; i < block_end; ++i) {
    // An expert-parallel rank's experts are a block of whole rows, which tensor ranks split as ever.
    const BlockShape whole = block_shape(spec, i), mine = expert_part(whole, ep.size),
                     shape = tensor_part(mine, tp.size);
    for (const BlockTensor& t : block_tensors(shape)) {
      if (!held(t, shape)) continue;
      const bool expert = ep.size > 1 && (t.rows == Dim::experts_fc || t.rows == Dim::experts_C);
      TpSlice split;
      if (tp.size > 1 && (split_by_tp(t.rows) || split_by_tp(t.cols))) {
        const Dim d = split_by_tp(t.rows) ? t.rows : t.cols;
        // a key/value head may be held by several ranks
        const bool kv = d == Dim::kv || d == Dim::kv_bias || d == Dim::kv_norm;
        split = {shape_of(t, whole), split_by_tp(t.rows) ? 0 : 1, split_groups(d, mine),
                 kv ? heads_part(whole.NKV, tp) : tp, kv ? heads_replica(whole.NKV, tp) : TpPart{}};
      }
      if (expert) {
        if (split.axis < 0) split.part = split.replica = tp;  // whole on every tensor rank
        split.whole = shape_of(t, whole);
        split.row_offset = static_cast<size_t>(ep.rank) * extent(t.rows, mine);
      }
      add(block_tensor_name(i, t), shape_of(t, shape), t.decay, t.init, false, split);
      params.back().expert = expert;
      const bool norm = t.field == &BlockPtrs::ln1w || t.field == &BlockPtrs::ln1b || t.field == &BlockPtrs::ln2w ||
                        t.field == &BlockPtrs::ln2b;
      params.back().sums_over_tokens = norm && sequence_parallel;
    }
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
                                     TpPart tp, TpPart ep) {
  std::vector<ParamTensor> params;
  for (const ChunkRange& c : chunks) {
    const size_t offset = params.empty() ? 0 : params.back().offset + params.back().size;
    size_t dropped = 0;  // a tied head's copy of wte, on the rank that holds wte itself (a vee)
    for (ParamTensor& p : stage_params(spec, c.vstage, n_virtual, c.block_begin, c.block_end, tp, ep)) {
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

ParamStore::ParamStore(std::vector<ParamTensor> params, int n_layer) : params_(std::move(params)), n_layer_(n_layer) {
  const size_t total = params_.empty() ? 0 : params_.back().offset + params_.back().size;
  weights_.resize(total);
  grads_.resize(total);
}

size_t ParamStore::offset_of(const std::string& name) const {
  const ParamTensor* p = find(name);
  return p ? p->offset : kAbsent;
}

const ParamTensor* ParamStore::find(const std::string& name) const {
  for (auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

void ParamStore::init(uint64_t seed) {
  const float resid_std = 0.02f / std::sqrt(2.f * n_layer_);
  std::vector<float> host(weights_.on_gpu() ? weights_.size() : 0);  // the CPU's is filled in place
  float* const all = weights_.on_gpu() ? host.data() : weights_.data();
  for (auto& p : params_) {
    float* w = all + p.offset;
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
  if (weights_.on_gpu()) weights_.assign(host.data(), host.size());
}

void ParamStore::zero_grads() { zero_values(grads_.data(), grads_.size()); }
void ParamStore::release_grads() { release_values(grads_.data(), grads_.size()); }

}  // namespace pipetrain
