// The transformer block of a Stage, forward beside backward: norm, attention, MLP, each with its
// residual. One block serves both model families: gpt2's LayerNorm, biases and GELU; llama's
// RMSNorm, rotary positions, grouped key/value heads and SwiGLU (absent tensors are null pointers,
// which the kernels skip). On a tensor rank the widths are its part (tensor_parallel.hpp): the
// output products' partial sums and the input gradients of the products fed by a whole activation
// are summed over the tensor group (sum_partials; with sequence parallelism reduce-scattered, and
// the products' inputs gathered first: whole_rows), each exchange as layer_decl.hpp declares it.
// The head is in stage_head.cpp, generation's forward in stage_generation.cpp; model.cpp holds
// the Stage around them: buffers and the passes the executor calls.
#include <stdexcept>
#include <vector>

#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/model/model.hpp"

namespace pipetrain {

void Stage::norm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int N) {
  if (shape_.llama()) k_.rmsnorm_forward(out, rstd, x, w, N, C_, norm_eps_);
  else k_.layernorm_forward(out, mean, rstd, x, w, b, N, C_);
}

void Stage::norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* x, const float* w,
                          const float* mean, const float* rstd, int N) {
  if (shape_.llama()) k_.rmsnorm_backward(dinp, dw, dout, x, w, rstd, N, C_);
  else k_.layernorm_backward(dinp, dw, db, dout, x, w, mean, rstd, N, C_);
}

void Stage::mlp_activation_forward(BlockActs& a, const float* fcb, int N) {
  if (shape_.llama()) k_.swiglu_forward(a.fch_gelu.data(), a.fch.data(), N, shape_.ffn);
  else k_.bias_gelu_forward(a.fch_gelu.data(), a.fch.data(), fcb, N, shape_.fc);
}

void Stage::mlp_activation_backward(float* dfch, float* dfcb, const BlockActs& a, const float* fcb, const float* dact,
                                    int N) {
  if (shape_.llama()) k_.swiglu_backward(dfch, a.fch.data(), dact, N, shape_.ffn);
  else k_.bias_gelu_backward(dfch, dfcb, a.fch.data(), fcb, dact, N, shape_.fc);
}

void Stage::sum_qk_partials(float* sums, int N) {
  if (tp_.size == 1) return;
  count_sent(Exchange::qk_norm, sizeof(float) * 2 * N);
  group_->sum(sums, 2 * static_cast<size_t>(N));
}

void Stage::qk_norm_forward(BlockActs& a, const float* w, int N) {
  const int Q = shape_.q, KV = shape_.kv, QK = Q + KV, QKV = shape_.qkv;
  float *raw = a.qk_raw.data(), *sums = scratch_.qk_sums.data();
  copy_rows(raw, QK, a.qkv.data(), QKV, QK, N);
  k_.split_rms_squares(sums, raw, N, Q, QK);
  k_.split_rms_squares(sums + N, raw + Q, N, KV, QK);
  sum_qk_partials(sums, N);
  // A key/value head several tensor ranks hold is in the group's sum kv_copies_ times: its mean
  // square divides by that many times its width.
  k_.split_rms_forward(a.qkv.data(), a.qk_rstd.data(), raw, sums, w, N, Q, QK, QKV, q_whole_, norm_eps_);
  k_.split_rms_forward(a.qkv.data() + Q, a.qk_rstd.data() + N, raw + Q, sums + N, w + Q, N, KV, QK, QKV,
                       kv_whole_ * kv_copies_, norm_eps_);
}

void Stage::qk_norm_backward(const BlockActs& a, float* dqkv, float* dw, const float* w, float* keep, int N) {
  const int Q = shape_.q, KV = shape_.kv, QK = Q + KV, QKV = shape_.qkv;
  const float *raw = a.qk_raw.data(), *rstd = a.qk_rstd.data();
  float* sums = scratch_.qk_sums.data();
  k_.split_rms_dots(sums, dqkv, raw, w, N, Q, QK, QKV);
  k_.split_rms_dots(sums + N, dqkv + Q, raw + Q, w + Q, N, KV, QK, QKV);
  sum_qk_partials(sums, N);  // a shared head's dot: its ranks' parts of dk, summed
  if (keep) copy_rows(keep, QK, dqkv, QKV, QK, N);
  k_.split_rms_backward(dqkv, dw, dqkv, raw, w, rstd, sums, N, Q, QK, QKV, q_whole_, 1.f);
  k_.split_rms_backward(dqkv + Q, dw ? dw + Q : nullptr, dqkv + Q, raw + Q, w + Q, rstd + N, sums + N, N, KV, QK, QKV,
                        kv_whole_, 1.f / kv_copies_);
}

void Stage::block_forward(const Chunk& c, int l, const float* x, BlockActs& a, float* out, const Tokens& tok) {
  const int N = tok.rows(), R = kept_rows(N), C = C_, Q = shape_.q, NH = shape_.NH, NKV = shape_.NKV;
  BlockPtrs w = block_weights(c, l);
  norm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, w.ln1w, w.ln1b, R);
  k_.matmul_forward(a.qkv.data(), whole_rows(a.ln1.data(), N), w.qkvw, w.qkvb, N, C, shape_.qkv);
  poll();
  if (shape_.qk_norm) qk_norm_forward(a, w.qknormw, N);
  if (shape_.llama())
    k_.rope_forward(a.qkv.data(), tok.B, tok.T, Q, NH, NKV, rope_theta_, tok.cache ? tok.cache->pos : 0, tok.pos);
  if (tok.cache) {
    attention_forward_cached(a.atty.data(), a.qkv.data(), tok.cache->k[l].data(), tok.cache->v[l].data(),
                             tok.cache->pos, tok.T, Q, NH, NKV, tok.doc_start);
  } else {
    k_.attention_forward(a.atty.data(), a.lse.data(), a.qkv.data(), tok.B, tok.T, Q, NH, NKV, tok.doc_start);
  }
  poll();
  k_.matmul_forward(scratch_.attproj.data(), a.atty.data(), w.projw, nullptr, N, Q, C);
  poll();
  k_.residual_forward(a.res2.data(), x, sum_partials(scratch_.attproj.data(), N, scratch_.summed.data()), w.projb, R,
                      C);
  norm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), w.ln2w, w.ln2b, R);
  if (is_moe(c, l)) {
    moe_forward(a, w, whole_rows(a.ln2.data(), N), scratch_.fcproj.data(), N, c.block_begin + l);
  } else {
    k_.matmul_forward(a.fch.data(), whole_rows(a.ln2.data(), N), w.fcw, nullptr, N, C, shape_.fc);
    poll();
    mlp_activation_forward(a, w.fcb, N);
    k_.matmul_forward(scratch_.fcproj.data(), a.fch_gelu.data(), w.fcprojw, nullptr, N, shape_.ffn, C);
    poll();
  }
  k_.residual_forward(out, a.res2.data(), sum_partials(scratch_.fcproj.data(), N, scratch_.summed.data()), w.fcprojb, R,
                      C);
}

// dout may not alias dinp. Both residual branches pass dout straight through to their input.
// With `g` (a fused backward) each kernel also adds its parameter gradients in the same pass;
// without (the input half of a split backward) the output gradients the parameters need are left
// in w for block_backward_weight. Either way the bits come out the same. With sequence parallelism
// dout, dinp and the norms' gradients are this rank's rows; the products take all rows (gathered
// into scratch_.gathered, one at a time) and give partial input gradients that sum_partials scatters.
void Stage::block_backward_input(const Chunk& c, int l, const float* x, const BlockActs& a, const float* dout,
                                 float* dinp, BlockWGrads& w, const BlockPtrs* g, const Tokens& tok) {
  const int N = B_ * T_, R = kept_rows(N), C = C_, Q = shape_.q;
  const size_t NC = static_cast<size_t>(N) * C, RC = static_cast<size_t>(R) * C;
  BlockPtrs p = block_weights(c, l);
  auto grad = [&](float* BlockPtrs::*field) { return g ? g->*field : nullptr; };
  // out = res2 + mlp(ln2(res2))
  const float* dout_all = whole_rows(dout, N);
  if (!g) copy_values(w.dout.data(), dout_all, NC);
  if (is_moe(c, l)) {
    moe_backward_input(a, w, g, p, dout_all, a.ln2.data(), partial_target(w.dln2.data()), N);
  } else {
    k_.matmul_backward(scratch_.dfch_gelu.data(), grad(&BlockPtrs::fcprojw), grad(&BlockPtrs::fcprojb), dout_all,
                       a.fch_gelu.data(), p.fcprojw, N, shape_.ffn, C);
    poll();
    // a fused backward's fc bias gradient: summed in the activation's pass, not the product's
    mlp_activation_backward(w.dfch.data(), grad(&BlockPtrs::fcb), a, p.fcb, scratch_.dfch_gelu.data(), N);
    k_.matmul_backward(partial_target(w.dln2.data()), grad(&BlockPtrs::fcw), nullptr, w.dfch.data(),
                       whole_rows_if(g, a.ln2.data(), N), p.fcw, N, C, shape_.fc);
    poll();
  }
  sum_partials(partial_target(w.dln2.data()), N, w.dln2.data());
  float* dres2 = dinp;  // accumulate d(res2) in dinp, then continue through the attention branch
  copy_values(dres2, dout, RC);
  norm_backward(dres2, grad(&BlockPtrs::ln2w), grad(&BlockPtrs::ln2b), w.dln2.data(), a.res2.data(), p.ln2w,
                a.ln2_mean.data(), a.ln2_rstd.data(), R);
  const float* dres2_all = whole_rows(dres2, N);
  if (!g) copy_values(w.dres2.data(), dres2_all, NC);
  // res2 = x + proj(attn(rope(qkv(ln1(x)))))
  k_.matmul_backward(scratch_.datty.data(), grad(&BlockPtrs::projw), grad(&BlockPtrs::projb), dres2_all, a.atty.data(),
                     p.projw, N, Q, C);
  poll();
  k_.attention_backward(w.dqkv.data(), scratch_.datty.data(), a.qkv.data(), a.atty.data(), a.lse.data(), B_, T_, Q,
                        shape_.NH, shape_.NKV, tok.doc_start);
  if (shape_.llama()) k_.rope_backward(w.dqkv.data(), B_, T_, Q, shape_.NH, shape_.NKV, rope_theta_, 0, tok.pos);
  if (shape_.qk_norm)
    qk_norm_backward(a, w.dqkv.data(), grad(&BlockPtrs::qknormw), p.qknormw, g ? nullptr : w.dqk_normed.data(), N);
  poll();
  k_.matmul_backward(partial_target(w.dln1.data()), grad(&BlockPtrs::qkvw), grad(&BlockPtrs::qkvb), w.dqkv.data(),
                     whole_rows_if(g, a.ln1.data(), N), p.qkvw, N, C, shape_.qkv);
  poll();
  sum_partials(partial_target(w.dln1.data()), N, w.dln1.data());
  norm_backward(dinp, grad(&BlockPtrs::ln1w), grad(&BlockPtrs::ln1b), w.dln1.data(), x, p.ln1w, a.ln1_mean.data(),
                a.ln1_rstd.data(), R);
}

void Stage::block_backward_weight(const Chunk& c, int l, const float* x, const BlockActs& a, const BlockWGrads& w) {
  const int N = B_ * T_, R = kept_rows(N), C = C_;
  BlockPtrs g = block_ptrs(store_.grads(), c, l);
  if (is_moe(c, l)) {
    moe_backward_weight(a, w, g, whole_rows(a.ln2.data(), N), N);
  } else {
    k_.matmul_backward(nullptr, g.fcprojw, g.fcprojb, w.dout.data(), a.fch_gelu.data(), nullptr, N, shape_.ffn, C);
    poll();
    k_.matmul_backward(nullptr, g.fcw, g.fcb, w.dfch.data(), whole_rows(a.ln2.data(), N), nullptr, N, C, shape_.fc);
    poll();
  }
  norm_backward(nullptr, g.ln2w, g.ln2b, w.dln2.data(), a.res2.data(), nullptr, a.ln2_mean.data(), a.ln2_rstd.data(),
                R);
  k_.matmul_backward(nullptr, g.projw, g.projb, w.dres2.data(), a.atty.data(), nullptr, N, shape_.q, C);
  poll();
  k_.matmul_backward(nullptr, g.qkvw, g.qkvb, w.dqkv.data(), whole_rows(a.ln1.data(), N), nullptr, N, C, shape_.qkv);
  poll();
  if (shape_.qk_norm) {  // the norms' weights, from the normalised rows' gradients kept by the input half
    const int Q = shape_.q, KV = shape_.kv, QK = Q + KV;
    const float *raw = a.qk_raw.data(), *rstd = a.qk_rstd.data(), *dy = w.dqk_normed.data();
    k_.split_rms_backward(nullptr, g.qknormw, dy, raw, nullptr, rstd, nullptr, N, Q, QK, QK, q_whole_, 1.f);
    k_.split_rms_backward(nullptr, g.qknormw + Q, dy + Q, raw + Q, nullptr, rstd + N, nullptr, N, KV, QK, QK, kv_whole_,
                          1.f);
  }
  norm_backward(nullptr, g.ln1w, g.ln1b, w.dln1.data(), x, nullptr, a.ln1_mean.data(), a.ln1_rstd.data(), R);
}

}  // namespace pipetrain
