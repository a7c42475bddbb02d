// AdamW, clipping and the LR schedule (model/optim.hpp) against the formulas written out here
// independently, in double precision: PyTorch's AdamW (bias-corrected, decoupled decay on the
// tensors marked for it), clip_grad_norm_'s coefficient, linear warmup then cosine to min_lr.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "pipetrain/model/optim.hpp"

using namespace pipetrain;

namespace {

RunSpec spec_with(std::initializer_list<std::string> sets) { return parse_spec("", "", sets, 0); }

ParamTensor tensor(const std::string& name, size_t offset, size_t size, bool decay, bool tied_copy = false) {
  ParamTensor p;
  p.name = name;
  p.offset = offset;
  p.size = size;
  p.decay = decay;
  p.tied_copy = tied_copy;
  p.shape = {static_cast<int>(size)};
  return p;
}

}  // namespace

TEST_CASE("optim: AdamW follows PyTorch's update, decaying only the tensors marked for it", "[optim]") {
  const RunSpec spec = spec_with({"train.weight_decay=0.5", "train.beta1=0.8", "train.beta2=0.9", "train.eps=1e-6"});
  const auto& t = spec.train;
  const std::vector<ParamTensor> params = {tensor("w", 0, 3, true), tensor("b", 3, 2, false)};
  Floats weights, grads;
  weights.resize(5);
  grads.resize(5);
  std::vector<double> w = {0.5, -1.0, 2.0, 0.25, -0.75}, m(5, 0), v(5, 0);
  for (size_t i = 0; i < 5; ++i) weights.host()[i] = static_cast<float>(w[i]);
  AdamW adam(t, OptimizerShard(params, 0, 1));
  const double lrs[] = {0.01, 0.02, 0.005};
  const float muls[] = {1.0f, 0.5f, 1.0f};  // clipping scales the gradient on the fly
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < 5; ++i) grads.host()[i] = static_cast<float>(0.1 * (i + 1) * (step % 2 ? -1 : 1));
    adam.step(params, weights, grads, lrs[step], muls[step]);
    const int n = step + 1;
    for (size_t i = 0; i < 5; ++i) {
      const double g = double{grads.host()[i]} * muls[step];
      m[i] = t.beta1 * m[i] + (1 - t.beta1) * g;
      v[i] = t.beta2 * v[i] + (1 - t.beta2) * g * g;
      if (i < 3) w[i] *= 1 - lrs[step] * t.weight_decay;  // "w" decays, "b" does not
      const double m_hat = m[i] / (1 - std::pow(t.beta1, n)), v_hat = v[i] / (1 - std::pow(t.beta2, n));
      w[i] -= lrs[step] * m_hat / (std::sqrt(v_hat) + t.eps);
    }
  }
  CHECK(adam.steps_taken() == 3);
  for (size_t i = 0; i < 5; ++i) {
    INFO("element " << i);
    CHECK(weights.host()[i] == Approx(w[i]).epsilon(1e-5));
    CHECK(adam.exp_avg().host()[i] == Approx(m[i]).epsilon(1e-5));
    CHECK(adam.exp_avg_sq().host()[i] == Approx(v[i]).epsilon(1e-5));
  }
}

TEST_CASE("optim: clipping scales the gradient to grad_clip only when the norm exceeds it", "[optim]") {
  CHECK(clip_coefficient(0.5, 1.0) == 1.0f);
  CHECK(clip_coefficient(4.0, 1.0) == Approx(0.25).epsilon(1e-5));
  CHECK(clip_coefficient(1e6, 0.0) == 1.0f);  // grad_clip = 0: off
}

TEST_CASE("optim: the global norm counts a tied embedding's copy once", "[optim]") {
  const std::vector<ParamTensor> params = {tensor("wte.weight", 0, 2, true), tensor("h.0.x", 2, 1, false),
                                           tensor("wte.weight", 3, 2, true, /*tied_copy=*/true)};
  Floats grads;
  grads.resize(5);
  const float g[] = {1, 2, 3, 100, 100};
  for (size_t i = 0; i < 5; ++i) grads.host()[i] = g[i];
  const SlabView flat{grads.data(), false};
  CHECK(grad_sq_sum(params, flat, OptimizerShard(params, 0, 1)) == Approx(1 + 4 + 9));
  // Sharded over 2 ranks, the two halves' sums add up to the same norm.
  CHECK(grad_sq_sum(params, flat, OptimizerShard(params, 0, 2)) +
            grad_sq_sum(params, flat, OptimizerShard(params, 1, 2)) ==
        Approx(1 + 4 + 9));
}

TEST_CASE("optim: ZeRO-1 shards are row slabs that cover every element once, in rank order", "[optim][zero]") {
  std::vector<ParamTensor> params = {tensor("wte.weight", 0, 0, true), tensor("ln.bias", 35, 3, false),
                                     tensor("h.0.w", 38, 0, true)};
  params[0].shape = {7, 5};  // 7 rows of 5
  params[0].size = 35;
  params[2].shape = {2, 3};  // fewer rows than some rank counts
  params[2].size = 6;
  const size_t total = 44;
  for (int D : {1, 2, 3, 4}) {
    std::vector<int> owner(total, -1);
    size_t state = 0;
    for (int r = 0; r < D; ++r) {
      const OptimizerShard shard(params, r, D);
      REQUIRE(shard.slabs().size() == params.size());
      size_t offset = 0;
      for (const OptimizerShard::Slab& s : shard.slabs()) {
        const ParamTensor& p = params[s.tensor];
        CHECK(s.begin >= p.offset);
        CHECK(s.end <= p.offset + p.size);
        CHECK((s.begin - p.offset) % row_elements(p) == 0);  // whole rows
        CHECK(s.state_offset == offset);                     // compact, in slab order
        offset += s.size();
        for (size_t i = s.begin; i < s.end; ++i) {
          CHECK(owner[i] == -1);
          owner[i] = r;
        }
        std::vector<int> counts, offsets;
        shard.rank_parts(p, counts, offsets);
        CHECK(offsets[r] == static_cast<int>(s.begin - p.offset));
        CHECK(counts[r] == static_cast<int>(s.size()));
      }
      CHECK(shard.state_floats() == offset);
      state += offset;
    }
    INFO("D = " << D);
    CHECK(state == total);
    CHECK(std::is_sorted(owner.begin(), owner.begin() + 35));  // a tensor's slabs follow in rank order
    CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
    CHECK(OptimizerShard::max_state_floats(params, D) >= (total + D - 1) / D);
  }
}

TEST_CASE("optim: sharded AdamW updates each rank's slabs exactly as the whole update does", "[optim][zero]") {
  const RunSpec spec = spec_with({"train.weight_decay=0.1"});
  std::vector<ParamTensor> params = {tensor("w", 0, 0, true), tensor("b", 12, 3, false)};
  params[0].shape = {4, 3};
  params[0].size = 12;
  Floats whole, sharded, grads;
  whole.resize(15);
  sharded.resize(15);
  grads.resize(15);
  for (size_t i = 0; i < 15; ++i) whole.host()[i] = sharded.host()[i] = 0.1f * static_cast<float>(i) - 0.7f;
  AdamW all(spec.train, OptimizerShard(params, 0, 1));
  std::vector<AdamW> ranks;
  for (int r = 0; r < 3; ++r) ranks.emplace_back(spec.train, OptimizerShard(params, r, 3));
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < 15; ++i) grads.host()[i] = 0.05f * static_cast<float>((i * 7 + step) % 11) - 0.2f;
    all.step(params, whole, grads, 0.01, 0.5f);
    for (AdamW& a : ranks) a.step(params, sharded, grads, 0.01, 0.5f);  // each touches its slabs only
  }
  for (size_t i = 0; i < 15; ++i) CHECK(sharded.host()[i] == whole.host()[i]);  // bit for bit
  CHECK(ranks[0].exp_avg().size() + ranks[1].exp_avg().size() + ranks[2].exp_avg().size() == 15);
}

TEST_CASE(
    "optim: ZeRO-2 and 3 keep the slabs' gradients (and weights) compactly and update them as the whole update does",
    "[optim][zero]") {
  const RunSpec spec = spec_with({"train.weight_decay=0.1"});
  std::vector<ParamTensor> params = {tensor("w", 0, 0, true), tensor("b", 12, 3, false)};
  params[0].shape = {4, 3};
  params[0].size = 12;
  for (int level : {2, 3}) {
    INFO("zero = " << level);
    Floats whole, flat, grads, no_grads;
    whole.resize(15);
    flat.resize(15);
    grads.resize(15);
    no_grads.resize(15);  // zeros: the compact copies must be what is read
    for (size_t i = 0; i < 15; ++i) whole.host()[i] = flat.host()[i] = 0.1f * static_cast<float>(i) - 0.7f;
    AdamW all(spec.train, OptimizerShard(params, 0, 1));
    std::vector<AdamW> ranks;
    for (int r = 0; r < 3; ++r) ranks.emplace_back(spec.train, OptimizerShard(params, r, 3, level));
    for (AdamW& a : ranks) {
      CHECK(a.grad_shard().size() == a.shard().state_floats());
      CHECK(a.weight_shard().size() == (level == 3 ? a.shard().state_floats() : 0));
      if (level == 3) a.take_weights(flat);
    }
    if (level == 3)
      std::fill(flat.host().begin(), flat.host().end(), 0.f);  // released: only the master copies hold weights
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < 15; ++i) grads.host()[i] = 0.05f * static_cast<float>((i * 7 + step) % 11) - 0.2f;
      all.step(params, whole, grads, 0.01, 0.5f);
      for (AdamW& a : ranks) {
        for (const OptimizerShard::Slab& s : a.shard().slabs())  // as the reduce-scatter leaves them
          std::copy(grads.host().begin() + s.begin, grads.host().begin() + s.end,
                    a.grad_shard().host().begin() + s.state_offset);
        a.step(params, flat, no_grads, 0.01, 0.5f);
      }
    }
    for (AdamW& a : ranks)
      for (const OptimizerShard::Slab& s : a.shard().slabs())
        for (size_t i = s.begin; i < s.end; ++i) {
          const float got = level == 3 ? a.weight_shard().host()[s.state_offset + (i - s.begin)] : flat.host()[i];
          CHECK(got == whole.host()[i]);  // bit for bit
        }
  }
}

TEST_CASE("optim: warmup rises linearly to lr, cosine decays to min_lr at the last step", "[optim]") {
  const RunSpec spec = spec_with({"run.steps=105", "train.warmup_steps=5", "train.lr=0.01", "train.min_lr=0.001"});
  CHECK(lr_at(spec, 0) == Approx(0.002));
  CHECK(lr_at(spec, 4) == Approx(0.01));  // the end of warmup reaches the peak
  CHECK(lr_at(spec, 5) == Approx(0.01));  // cosine starts at the peak
  CHECK(lr_at(spec, 54) == Approx(0.001 + 0.5 * 0.009 * (1 + std::cos(M_PI * 49.0 / 99))));
  CHECK(lr_at(spec, 104) == Approx(0.001));  // the last step
  for (int s = 6; s < 105; ++s) CHECK(lr_at(spec, s) <= lr_at(spec, s - 1));
}
