#include "pipetrain/optim.hpp"

#include <cmath>

namespace pipetrain {

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
    for (size_t i = p.offset; i < p.offset + p.size; ++i) sum += static_cast<double>(grads[i]) * grads[i];
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
    for (size_t i = p.offset; i < p.offset + p.size; ++i) {
      const float g = grads[i] * grad_mul;
      m_[i] = b1 * m_[i] + (1.f - b1) * g;
      v_[i] = b2 * v_[i] + (1.f - b2) * g * g;
      weights[i] *= decay;
      weights[i] -= step_size * m_[i] / (std::sqrt(v_[i]) * inv_sqrt_bc2 + eps);
    }
  }
}

}  // namespace pipetrain
