#include "pipetrain/model/block_tensors.hpp"

#include <algorithm>

namespace pipetrain {

BlockShape block_shape(const RunSpec& spec) {
  const auto& m = spec.model;
  BlockShape s;
  s.arch = m.arch;
  s.C = m.d_model;
  s.NH = m.n_head;
  s.head_dim = m.d_model / m.n_head;
  const bool llama = m.arch == Arch::llama;
  s.NKV = llama && m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  s.q = s.C;
  s.kv = s.NKV * s.head_dim;
  s.qkv = s.q + 2 * s.kv;
  s.ffn = llama ? (m.ffn_hidden > 0 ? m.ffn_hidden : llama_ffn_hidden(m.d_model, m.ffn_multiple_of)) : 4 * s.C;
  s.fc = llama ? 2 * s.ffn : s.ffn;
  s.norm_stats = llama ? 1 : 2;
  s.qkv_bias = llama && m.attention_bias;
  s.qk_norm = llama && m.qk_norm;
  return s;
}

BlockShape block_shape(const RunSpec& spec, int block) {
  BlockShape s = block_shape(spec);
  const auto& moe = spec.model.moe;
  if (!moe.block_is_moe(block)) return s;
  s.experts = s.held_experts = moe.experts;
  s.top_k = moe.top_k;
  s.ffn = moe.ffn_hidden > 0 ? moe.ffn_hidden : s.ffn;
  s.fc = 2 * s.ffn;
  s.shared_ffn = moe.shared_ffn_hidden > 0 ? moe.shared_ffn_hidden : moe.shared_experts * s.ffn;
  s.shared_gate = moe.shared_gate;
  return s;
}

BlockShape tensor_part(const BlockShape& whole, int tp) {
  BlockShape s = whole;
  for (int* width : {&s.NH, &s.q, &s.fc, &s.ffn, &s.shared_ffn}) *width /= tp;
  const int kv_parts = std::min(tp, s.NKV);  // fewer key/value heads than ranks: one on each
  s.NKV /= kv_parts;
  s.kv /= kv_parts;
  s.qkv = s.q + 2 * s.kv;
  return s;
}

BlockShape expert_part(const BlockShape& whole, int ep) {
  BlockShape s = whole;
  s.held_experts /= ep;
  return s;
}

BlockShape gpt2_block_shape(int C) {
  RunSpec spec;
  spec.model.d_model = C;
  spec.model.n_head = 1;
  return block_shape(spec);
}

double block_weight_macs(const BlockShape& s) {
  const double C = s.C, mlp = C * s.fc + static_cast<double>(s.ffn) * s.C;
  const double attention = C * s.qkv + static_cast<double>(s.q) * s.C;
  if (!s.moe()) return attention + mlp;
  // The router, the top_k experts a token goes to, the shared experts and their gate.
  return attention + C * s.experts + s.top_k * mlp + 3 * C * s.shared_ffn + (s.shared_gate ? C : 0);
}

}  // namespace pipetrain
