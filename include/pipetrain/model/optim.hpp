// AdamW as in PyTorch (bias-corrected, decoupled weight decay on 2-D weights only), global-norm
// gradient clipping as torch.nn.utils.clip_grad_norm_, and linear warmup + cosine decay.
#pragma once
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optimizer_shard.hpp"

namespace pipetrain {

// Learning rate of 0-based step `step`: linear warmup to lr over warmup_steps, then cosine to
// min_lr at the last step.
double lr_at(const RunSpec& spec, int step);

// Sum of squared gradients over the shard's slabs of the tensors that count toward the global norm
// (not a tied copy; a tensor whole on every tensor rank only on the first, a split one on each).
double grad_sq_sum(const std::vector<ParamTensor>& params, const Floats& grads, const OptimizerShard& shard);

// Multiplier applied to all gradients for clipping (1 when the norm is within grad_clip or clip = 0).
float clip_coefficient(double global_norm, double grad_clip);

// Moments live with the weights, on the compute device, for the shard's slabs only (compactly, in
// slab order); step updates those slabs of the weights and leaves the rest alone.
class AdamW {
 public:
  AdamW(const RunSpec::Train& cfg, OptimizerShard shard);
  // One update with learning rate lr; gradients are multiplied by grad_mul (clipping) on the fly.
  void step(const std::vector<ParamTensor>& params, Floats& weights, const Floats& grads, double lr, float grad_mul);
  const OptimizerShard& shard() const { return shard_; }
  int steps_taken() const { return t_; }
  void set_steps_taken(int t) { t_ = t; }  // when resuming: bias correction continues from t
  Floats& exp_avg() { return m_; }
  Floats& exp_avg_sq() { return v_; }
  const Floats& exp_avg() const { return m_; }
  const Floats& exp_avg_sq() const { return v_; }

 private:
  RunSpec::Train cfg_;
  OptimizerShard shard_;
  int t_ = 0;
  Floats m_, v_;
};

}  // namespace pipetrain
