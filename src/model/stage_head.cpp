// The head of the last virtual stage, forward beside backward: the final norm, the LM head's
// product and the softmax cross-entropy loss. On tensor ranks each holds a part of the vocabulary:
// the loss's softmax runs over the group (the row maxima, then the sums of exponentials and the
// target logits, each reduced over the group: softmax_loss).
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/model/model.hpp"

namespace pipetrain {

double Stage::head_forward(const float* x, HeadActs& a, const int* targets, const Tokens& tok) {
  const int N = tok.rows(), C = C_;
  norm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), x, weight(lnfw_), weight(lnfb_), kept_rows(N));
  k_.matmul_forward(scratch_.logits.data(), whole_rows(a.lnf.data(), N), weight(head_), nullptr, N, C, V_);
  poll();
  return softmax_loss(a, targets, N);
}

double Stage::softmax_loss(HeadActs& a, const int* targets, int N) {
  if (tp_.size == 1) return k_.softmax_crossentropy_forward(a.probs.data(), scratch_.logits.data(), targets, N, V_);
  k_.vocab_softmax_max(scratch_.row_max.data(), scratch_.logits.data(), N, V_);
  count_sent(Exchange::max, sizeof(float) * N);
  group_->max(scratch_.row_max.data(), N);
  k_.vocab_softmax_exp(a.probs.data(), softmax_stats_.data(), scratch_.logits.data(), scratch_.row_max.data(), targets,
                       N, V_, v_begin_);
  count_sent(Exchange::stats, sizeof(double) * kSplitVocabDoublesPerRow * N);
  group_->sum(softmax_stats_.data(), kSplitVocabDoublesPerRow * N);
  return k_.vocab_softmax_finish(a.probs.data(), scratch_.row_max.data(), softmax_stats_.data(), N, V_);
}

void Stage::head_backward_input(const float* x, const HeadActs& a, const int* targets, float* dinp, HeadWGrads& w,
                                bool fused) {
  const int N = B_ * T_, C = C_;
  k_.softmax_crossentropy_backward(w.dlogits.data(), a.probs.data(), targets, grad_scale_, N, V_, v_begin_);
  k_.matmul_backward(partial_target(w.dlnf.data()), fused ? store_.grads().data() + head_ : nullptr, nullptr,
                     w.dlogits.data(), whole_rows_if(fused, a.lnf.data(), N), weight(head_), N, C, V_);
  poll();
  sum_partials(partial_target(w.dlnf.data()), N, w.dlnf.data());
  norm_backward(dinp, fused ? store_.grads().data() + lnfw_ : nullptr, fused ? tensor(store_.grads(), lnfb_) : nullptr,
                w.dlnf.data(), x, weight(lnfw_), a.lnf_mean.data(), a.lnf_rstd.data(), kept_rows(N));
}

void Stage::head_backward_weight(const float* x, const HeadActs& a, const HeadWGrads& w) {
  const int N = B_ * T_, C = C_;
  k_.matmul_backward(nullptr, store_.grads().data() + head_, nullptr, w.dlogits.data(), whole_rows(a.lnf.data(), N),
                     nullptr, N, C, V_);
  poll();
  norm_backward(nullptr, store_.grads().data() + lnfw_, tensor(store_.grads(), lnfb_), w.dlnf.data(), x, nullptr,
                a.lnf_mean.data(), a.lnf_rstd.data(), kept_rows(N));
}

}  // namespace pipetrain
