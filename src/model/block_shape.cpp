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
  return s;
}

BlockShape tensor_part(const BlockShape& whole, int tp) {
  BlockShape s = whole;
  for (int* width : {&s.NH, &s.q, &s.fc, &s.ffn}) *width /= tp;
  const int kv_parts = std::min(tp, s.NKV);  // fewer key/value heads than ranks: one on each
  s.NKV /= kv_parts;
  s.kv /= kv_parts;
  s.qkv = s.q + 2 * s.kv;
  return s;
}

BlockShape gpt2_block_shape(int C) {
  RunSpec spec;
  spec.model.d_model = C;
  spec.model.n_head = 1;
  return block_shape(spec);
}

double block_weight_macs(const BlockShape& s) {
  return static_cast<double>(s.C) * s.qkv + static_cast<double>(s.q) * s.C + static_cast<double>(s.C) * s.fc +
         static_cast<double>(s.ffn) * s.C;
}

}  // namespace pipetrain
