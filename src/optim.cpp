#include "pipetrain/optim.hpp"

#include <cmath>

#include "pipetrain/parallel_for.hpp"

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

double grad_sq_sum(const std::vector<ParamTensor>& params, const std::vector<float>& grads) {
  double sum = 0;
  for (auto& p : params) {
    if (p.tied_copy) continue;  // counted once, on the first stage
    // per-chunk partials added in chunk order: the same sum on any thread count
    std::vector<double> partial(chunk_count(p.size, kAdamChunk), 0.0);
    parallel_for(p.size, kAdamChunk, [&](size_t begin, size_t end) {
      double s = 0;
      for (size_t i = p.offset + begin; i < p.offset + end; ++i) s += static_cast<double>(grads[i]) * grads[i];
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

AdamW::AdamW(const RunSpec::Train& cfg, size_t n_weights) : cfg_(cfg), m_(n_weights, 0.f), v_(n_weights, 0.f) {}

void AdamW::step(const std::vector<ParamTensor>& params, std::vector<float>& weights, const std::vector<float>& grads,
                 double lr, float grad_mul) {
  ++t_;
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const double bc1 = 1.0 - std::pow(cfg_.beta1, t_), bc2 = 1.0 - std::pow(cfg_.beta2, t_);
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(cfg_.eps);
  for (auto& p : params) {
    const float decay = p.decay ? static_cast<float>(1.0 - lr * cfg_.weight_decay) : 1.f;
    float *w = weights.data(), *m = m_.data(), *v = v_.data();
    const float* gr = grads.data();
    parallel_for(p.size, kAdamChunk, [&](size_t begin, size_t end) {
      for (size_t i = p.offset + begin; i < p.offset + end; ++i) {
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
