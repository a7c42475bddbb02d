// The GPT slice one rank owns: a contiguous range of blocks, plus the embeddings on the first stage
// and the final LayerNorm + LM head + loss on the last. Parameters, gradients and optimizer state
// live in flat buffers (one contiguous range per named tensor) so gradient buckets and checkpoints
// are slices of one array. Names are global (h.{i} uses the global block index).
//
// Activations: forward(mb) computes one micro-batch and keeps what the recompute mode says until
// backward(mb): none = everything backward needs; block = each block's input (blocks are re-run
// one at a time in backward); stage = only the stage input (the whole stage is re-run).
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "pipetrain/config.hpp"

namespace pipetrain {

enum class Recompute { none, stage, block };
Recompute parse_recompute(const std::string& s);

struct ParamTensor {
  std::string name;
  std::vector<int> shape;
  size_t offset = 0, size = 0;
  bool decay = false;      // AdamW weight decay applies (2-D weights only)
  bool tied_copy = false;  // the last stage's copy of a tied wte: not in the grad norm, not saved
};

// The named tensors a stage owns, in buffer order with offsets (no allocation): embeddings on the
// first stage, blocks [block_begin, block_end), final LayerNorm and head on the last.
std::vector<ParamTensor> stage_params(const RunSpec& spec, int stage, int n_stages, int block_begin, int block_end);

// Bytes one micro-batch keeps between its forward and its backward on a stage of `blocks` blocks,
// by recompute mode (the formula Stage's buffers realise; plan predicts memory with it):
// none: per block 16C+4 floats per token (input, ln1, qkv, attention output, res2, ln2, fc, gelu,
// two mean/rstd pairs) plus b·heads·T² attention probabilities, and on the last stage the head's
// input, ln_f output, mean/rstd and V probabilities per token; block: each block's input (+ the
// head's); stage: the received input only. Plus tokens (first stage) and targets (last), 4 B each.
size_t stash_bytes_per_micro_batch(const RunSpec& spec, int stage, int n_stages, int blocks, Recompute mode);

// Bytes a split backward keeps from a micro-batch's input half (B) to its weight half (W): every
// layer's output gradient (11 C floats per token per block, the head's V + C, the embedding's C).
size_t wgrad_bytes_per_micro_batch(const RunSpec& spec, int stage, int n_stages, int blocks);

// Bytes a stage uses besides parameters, gradients, AdamW state and stashed activations: the
// per-micro-batch scratch of forward/backward (projections, activation gradients, logits), the
// executor's send/receive rings, and under recompute one micro-batch's full activations that
// backward re-runs into.
size_t working_bytes(const RunSpec& spec, int stage, int n_stages, int blocks);

struct BlockActs {
  std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
};
struct HeadActs {
  std::vector<float> lnf, lnf_mean, lnf_rstd, probs;
};
// What the parameter gradients need besides the activations: each layer's output gradient,
// produced by the input-gradient pass (B) and consumed by the weight-gradient pass (W). A split
// backward keeps them between the two; a fused one uses one scratch set.
struct BlockWGrads {
  std::vector<float> dout, dfch, dln2, dres2, dqkv, dln1;  // 11 C floats per token
};
struct HeadWGrads {
  std::vector<float> dlogits, dlnf, dembed;  // dembed: the stage input's gradient (first stage)
};
// One micro-batch's activations. xs[l] is block l's input; on the last stage xs[L] is the head input.
struct Acts {
  std::vector<int> tokens, targets;
  std::vector<std::vector<float>> xs;
  std::vector<BlockActs> blocks;
  HeadActs head;
  std::vector<BlockWGrads> wblocks;  // between backward_input and backward_weight only
  HeadWGrads whead;
  size_t bytes() const;  // what is held right now, counted from the buffers themselves
  void release();        // drop contents, keep capacity (no allocator churn between steps)
};

class Stage {
 public:
  // Owns global blocks [block_begin, block_end) of stage `stage` out of `n_stages`; `micro_batches`
  // stash slots; `grad_scale` = dLoss/d(token loss) = 1 / (tokens per micro-batch x M x dp).
  Stage(const RunSpec& spec, int stage, int n_stages, int block_begin, int block_end, int micro_batches,
        float grad_scale);

  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == n_stages_ - 1; }
  int block_begin() const { return block_begin_; }
  int block_end() const { return block_end_; }
  size_t boundary_floats() const { return static_cast<size_t>(B_) * T_ * C_; }  // one activation

  const std::vector<ParamTensor>& params() const { return params_; }
  std::vector<float>& weights() { return weights_; }
  std::vector<float>& grads() { return grads_; }
  const ParamTensor* find(const std::string& name) const;
  void init_params(uint64_t seed);  // deterministic per name: same weights on any layout
  void zero_grads();

  // Inputs of micro-batch mb: tokens (first stage), targets (last stage), or the buffer the
  // previous stage's activation is received into (other stages; valid until backward(mb)).
  void set_tokens(int mb, const int* tokens);
  void set_targets(int mb, const int* targets);
  float* input_buffer(int mb);

  // Returns the summed token loss on the last stage (0 elsewhere); non-last stages write their
  // output activation to `out` (boundary_floats()).
  double forward(int mb, float* out);
  // `dout`: gradient of this stage's output (non-last stages); writes the input gradient to `dinp`
  // (non-first stages). Parameter gradients accumulate. Releases mb's stash. `done_from`, if
  // given, is called as parameters' gradients receive their last contribution of this backward,
  // with the buffer offset from which all gradients are now complete (it only falls: the layout
  // runs embeddings, blocks, head, and backward visits them in reverse).
  void backward(int mb, const float* dout, float* dinp, const std::function<void(size_t)>& done_from = nullptr);
  // The same backward in two halves (recompute = none only): backward_input computes the input
  // gradient (sent on at once) and keeps the output gradients the parameters need; backward_weight,
  // possibly much later, adds the parameter gradients and releases mb. Together they give the same
  // bits as backward().
  void backward_input(int mb, const float* dout, float* dinp);
  void backward_weight(int mb, const std::function<void(size_t)>& done_from = nullptr);
  size_t stash_bytes(int mb) const { return slot_of_[mb] < 0 ? 0 : pool_[slot_of_[mb]].bytes(); }
  // Seconds the last backward() spent re-running forwards (recompute modes), for the trace.
  double last_recompute_s() const { return recompute_s_; }

 private:
  struct BlockPtrs {
    float *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  };
  BlockPtrs block_ptrs(std::vector<float>& base, int local_block);
  void size_acts(Acts& a);
  void compute_forward(Acts& w, const Acts& s, float* out, double* loss);
  void block_forward(int l, const float* x, BlockActs& a, float* out);
  void backward_pass(int mb, const float* dout, float* dinp, bool input, bool weight,
                     const std::function<void(size_t)>& done_from);
  void block_backward_input(int l, const float* x, const BlockActs& a, const float* dout, float* dinp, BlockWGrads& w,
                            const BlockPtrs* fused_grads);
  void block_backward_weight(int l, const float* x, const BlockActs& a, const BlockWGrads& w);
  double head_forward(const float* x, HeadActs& a, const int* targets);
  void head_backward_input(const float* x, const HeadActs& a, const int* targets, float* dinp, HeadWGrads& w,
                           bool fused);
  void head_backward_weight(const float* x, const HeadActs& a, const HeadWGrads& w);

  int stage_, n_stages_, block_begin_, block_end_, L_;
  int B_, T_, C_, NH_, V_, n_layer_;
  bool tied_;
  Recompute mode_;
  float grad_scale_;
  double recompute_s_ = 0;
  std::vector<ParamTensor> params_;
  std::vector<float> weights_, grads_;
  size_t wte_ = 0, wpe_ = 0, lnfw_ = 0, lnfb_ = 0, head_ = 0;
  std::vector<size_t> block_offset_;

  // Activations of the micro-batches in flight. Slots are reused once a backward releases them
  // (keeping their capacity), so the memory held grows to the schedule's peak in flight (M for
  // GPipe, P - stage for 1F1B), not to M.
  Acts& stash(int mb);  // the slot of mb, taken from the free ones on first use
  void release(int mb);
  std::deque<Acts> pool_;  // a deque: growing it never moves the slots in use
  std::vector<int> slot_of_;  // per micro-batch: its slot in pool_, or -1
  std::vector<int> free_;
  Acts work_;                // recompute target when mode != none
  // scratch for one micro-batch
  std::vector<float> attproj_, fcproj_, logits_, dres_, dx_, datty_, dfch_gelu_;
  BlockWGrads wscratch_;  // a fused backward's output gradients, one block at a time
  HeadWGrads hscratch_;
};

}  // namespace pipetrain
