#include "pipetrain/model/optim.hpp"
#include "pipetrain/util/faults.hpp"

#include <cmath>

#include "pipetrain/compute/gpu_kernels.hpp"
#include "pipetrain/compute/parallel_for.hpp"
#include "pipetrain/compute/profile.hpp"

namespace pipetrain {
namespace {
constexpr size_t kAdamChunk = 16384;  // elements per parallel_for chunk
}  // namespace

double lr_at(const RunSpec& spec, int step) {
  const auto& t = spec.train;
  if (step < t.warmup_steps) return t.lr * (step + 1) / t.warmup_steps;
  const int decay_steps = spec.run.steps - t.warmup_steps;
  if (decay_steps <= 1) return t.lr;
  const double progress = static_cast<double>(step - t.warmup_steps) / (decay_steps - 1);
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(M_PI * progress));
}

double grad_sq_sum(const std::vector<ParamTensor>& params, SlabView grads, const OptimizerShard& shard,
                   const std::function<bool(const ParamTensor&)>& counted) {
  KernelTimer timer(Kernel::optimizer);
  double sum = 0;
  for (const OptimizerShard::Slab& slab : shard.slabs()) {
    const ParamTensor& p = params[slab.tensor];
    if (p.tied_copy) continue;      // counted once, on the first stage
    if (!p.tp.counted()) continue;  // held whole by several tensor ranks, or a shared key/value head: once
    if (counted && !counted(p)) continue;
    const float* slab_grads = grads.at(slab);
    if (compute_device() == Device::gpu) {
      sum += gpu::sum_of_squares(slab_grads, slab.size());
      continue;
    }
    // per-chunk partials added in chunk order: the same sum on any thread count
    std::vector<double> partial(chunk_count(slab.size(), kAdamChunk), 0.0);
    parallel_for(slab.size(), kAdamChunk, [&](size_t begin, size_t end) {
      const float* g = slab_grads;  // a local pointer: through the lambda's captures the loop vectorises otherwise
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (size_t i = begin; i < end; ++i) s += static_cast<double>(g[i]) * g[i];
      partial[begin / kAdamChunk] = s;
    });
    for (double s : partial) sum += s;
  }
  return sum;
}

float clip_coefficient(double global_norm, double grad_clip) {
  if (grad_clip <= 0) return 1.f;
  double coef = grad_clip / (global_norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.f;
}

AdamW::AdamW(const RunSpec::Train& cfg, OptimizerShard shard)
    : cfg_(cfg),
      shard_(std::move(shard)),
      m_(shard_.state_floats()),
      v_(shard_.state_floats()),
      g_(shard_.shards_grads() ? shard_.state_floats() : 0),
      w_(shard_.shards_weights() ? shard_.state_floats() : 0) {}

void AdamW::take_weights(const Floats& flat) {
  for (const OptimizerShard::Slab& slab : shard_.slabs())
    copy_values(w_.data() + slab.state_offset, flat.data() + slab.begin, slab.size());
}

void AdamW::step(const std::vector<ParamTensor>& params, Floats& weights, Floats& grads, double lr, float grad_mul) {
  KernelTimer timer(Kernel::optimizer);
  ++t_;
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const double bc1 = 1.0 - std::pow(cfg_.beta1, t_), bc2 = 1.0 - std::pow(cfg_.beta2, t_);
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(cfg_.eps);
  const std::vector<OptimizerShard::Slab>& slabs = shard_.slabs();
  for (const OptimizerShard::Slab& slab : slabs) {
    if (&slab == &slabs[slabs.size() / 2]) fault_hooks().reach(FaultPoint::kill_in_optimizer);  // test-only
    const float decay = params[slab.tensor].decay ? static_cast<float>(1.0 - lr * cfg_.weight_decay) : 1.f;
    float* const ws = weights_in(weights).at(slab);
    const float* const gs = grads_in(grads).at(slab);
    if (weights.on_gpu()) {
      gpu::adamw_update(ws, gs, m_.data() + slab.state_offset, v_.data() + slab.state_offset, slab.size(), b1, b2,
                        step_size, inv_sqrt_bc2, eps, decay, grad_mul);
      continue;
    }
    parallel_for(slab.size(), kAdamChunk, [&](size_t begin, size_t end) {
      // local pointers: through the lambda's captures GCC reloads them after every store
      float *w = ws, *m = m_.data() + slab.state_offset, *v = v_.data() + slab.state_offset;
      const float* gr = gs;
#pragma omp simd
      for (size_t i = begin; i < end; ++i) {
        const float g = gr[i] * grad_mul;
        m[i] = b1 * m[i] + (1.f - b1) * g;
        v[i] = b2 * v[i] + (1.f - b2) * g * g;
        w[i] *= decay;
        w[i] -= step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps);
      }
    });
  }
}

}  // namespace pipetrain
