// AdamW as in PyTorch (bias-corrected, decoupled weight decay on 2-D weights only), global-norm
// gradient clipping as torch.nn.utils.clip_grad_norm_, and linear warmup + cosine decay.
#pragma once
#include <functional>
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optimizer_shard.hpp"

namespace pipetrain {

// Learning rate of 0-based step `step`: linear warmup to lr over warmup_steps, then cosine to
// min_lr at the last step.
double lr_at(const RunSpec& spec, int step);

// Sum of squared gradients over the shard's slabs of the tensors that count toward the global norm
// (not a tied copy; a tensor whole on every tensor rank only on the first, a split one on each),
// of those `counted` says this rank counts (all without it). `grads`: where the slabs' gradients
// lie (AdamW::grads_in).
double grad_sq_sum(const std::vector<ParamTensor>& params, SlabView grads, const OptimizerShard& shard,
                   const std::function<bool(const ParamTensor&)>& counted = nullptr);

// Multiplier applied to all gradients for clipping (1 when the norm is within grad_clip or clip = 0).
float clip_coefficient(double global_norm, double grad_clip);

// Moments live with the weights, on the compute device, for the shard's slabs only (compactly, in
// slab order); step updates those slabs of the weights and leaves the rest alone. Under ZeRO-2 and
// 3 the shard's summed gradient is kept here too, compact like the moments, and under ZeRO-3 its
// weights (the master copy the stage's flat buffer is gathered from, layer by layer).
class AdamW {
 public:
  AdamW(const RunSpec::Train& cfg, OptimizerShard shard);
  // One update with learning rate lr; gradients are multiplied by grad_mul (clipping) on the fly.
  // `weights` and `grads` are the stage's flat buffers, read only where the shard keeps no
  // compact copy.
  void step(const std::vector<ParamTensor>& params, Floats& weights, Floats& grads, double lr, float grad_mul);
  const OptimizerShard& shard() const { return shard_; }
  // The shard's summed gradient (ZeRO-2, 3) and weights (ZeRO-3); empty where not kept.
  Floats& grad_shard() { return g_; }
  Floats& weight_shard() { return w_; }
  const Floats& weight_shard() const { return w_; }
  // Where the slabs' gradients and weights are: the compact copies where kept, else `flat`.
  SlabView grads_in(Floats& flat) {
    return shard_.shards_grads() ? SlabView{g_.data(), true} : SlabView{flat.data(), false};
  }
  SlabView weights_in(Floats& flat) {
    return shard_.shards_weights() ? SlabView{w_.data(), true} : SlabView{flat.data(), false};
  }
  // ZeRO-3: copies the shard's slabs of `flat` (weights just initialised or loaded) to the master
  // copy; the caller then drops `flat`.
  void take_weights(const Floats& flat);
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
  Floats m_, v_, g_, w_;
};

}  // namespace pipetrain
