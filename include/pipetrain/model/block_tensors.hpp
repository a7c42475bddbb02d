// One transformer block's shape and tensors, per model family, in the order they sit in the
// parameter buffers: the single list from which a stage's named parameters (stage_params), the
// per-block pointers the layers use (BlockPtrs), generate's lookup by name and the initialisation
// are all derived. Reordering or adding a line here changes all of them together.
//
// gpt2: LayerNorm, q/k/v packed in one matrix with biases, a GELU MLP 4 d_model wide.
// llama: RMSNorm (weight only), q, k and v as three matrices laid out one after another (so they
// are one [C + 2 kv, C] product, the packed qkv of the kernels), grouped-query attention with
// rotary positions, a SwiGLU MLP whose gate and up matrices likewise form one [2 ffn, C]
// product, and no biases but (model.attention_bias, Qwen2's) the q, k and v products' (one [C + 2 kv]
// bias of the packed product). Tensor names after "h.{i}." are PyTorch's GPT-2 / Hugging Face Llama's.
// llama MoE block (model.moe): the llama block with a mixture of experts for its MLP: a router
// [experts, C], the experts' gate | up matrices stacked expert after expert ([experts x 2 ffn, C],
// each expert's gate rows then its up rows) and their down matrices likewise ([experts x C, ffn]),
// and, with shared experts, one always-on SwiGLU of their summed width, its output scaled per token
// by a sigmoid gate [1, C] where it has one (Qwen-MoE's).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"

namespace pipetrain {

// The widths a block's products and activations have, from the spec. On a tensor-parallel rank
// (tensor_part) the heads and the widths they make up, and the MLP's hidden width, are its share:
// everything but C and head_dim divided by tp.
struct BlockShape {
  Arch arch = Arch::gpt2;
  int C = 0, NH = 0, NKV = 0;  // d_model, query heads, key/value heads (= NH for gpt2)
  int head_dim = 0;
  int q = 0;           // NH x head_dim: the width of q and of the attention's output (C on one rank)
  int kv = 0;          // NKV x head_dim: the width of k and of v
  int qkv = 0;         // q + 2 kv: the q, k, v product's output
  int fc = 0;          // the MLP's first product's output: 4C (gpt2), 2 ffn (llama: gate | up)
  int ffn = 0;         // the MLP's hidden width, the last product's input: 4C, or ffn_hidden
  int norm_stats = 0;  // floats per token a norm keeps for backward: mean and rstd, or rstd
  // An MoE block (experts > 0): fc and ffn are then each expert's, and a token goes to top_k of
  // them; shared_ffn is the always-on experts' width (0: none). The router chooses among all
  // `experts`; an expert-parallel rank holds `held_experts` of them (expert_part), all on one rank.
  int experts = 0, top_k = 0, shared_ffn = 0, held_experts = 0;
  bool shared_gate = false;  // the shared experts' output scaled per token by a learned sigmoid gate
  bool qkv_bias = false;     // llama with model.attention_bias: q, k and v products with biases
  bool qk_norm = false;      // llama with model.qk_norm: q and k each RMS-normalised over all heads
  bool llama() const { return arch == Arch::llama; }
  bool moe() const { return experts > 0; }
  int routes() const { return moe() ? top_k : 1; }  // MLP rows per token: one, or a row per chosen expert
};
// A dense block's widths (every block of a dense model).
BlockShape block_shape(const RunSpec& spec);
// Global block `block`'s widths: an MoE block's (model.moe.block_is_moe) or the dense one.
BlockShape block_shape(const RunSpec& spec, int block);
// One tensor rank's share of `whole` among `tp` (the spec has checked that tp divides the query
// heads and the MLP's width, and divides the key/value heads or is a multiple of them: then a rank
// holds one key/value head).
BlockShape tensor_part(const BlockShape& whole, int tp);
// One expert-parallel rank's share of `whole`'s experts among `ep` (the spec has checked ep divides them).
BlockShape expert_part(const BlockShape& whole, int ep);
// A GPT-2 block of width C (the interop formats, which are GPT-2's).
BlockShape gpt2_block_shape(int C);

// Multiply-adds per token of a block's weight products (q/k/v, output, the MLP's two or three; in an MoE
// block the router's, the top_k experts' a token goes to and the shared experts': the active ones).
double block_weight_macs(const BlockShape& s);

// Addresses of one block's tensors (weights or their gradients), named as the layers use them.
// A family without a tensor leaves its pointer null (llama: every bias, ln1b, ln2b).
struct BlockPtrs {
  float *ln1w = nullptr, *ln1b = nullptr, *qkvw = nullptr, *qkvb = nullptr, *projw = nullptr, *projb = nullptr,
        *ln2w = nullptr, *ln2b = nullptr, *fcw = nullptr, *fcb = nullptr, *fcprojw = nullptr, *fcprojb = nullptr;
  // An MoE block: fcw and fcprojw are the experts' stacked matrices; the router; the shared experts'.
  float *routerw = nullptr, *sharedw = nullptr, *sharedprojw = nullptr, *sharedgatew = nullptr;
  float* qknormw = nullptr;  // model.qk_norm: q's norm weights, then k's
};

// How a tensor starts: N(0, 0.02); residual output projections N(0, 0.02/sqrt(2L)) (GPT-2's init)
enum class Init { zeros, ones, normal, residual_normal };

// A tensor dimension, as one of the block's widths. Tensor parallelism splits the heads (q, kv,
// qkv) and the MLP's hidden widths (fc, ffn, each expert's gate | up rows, the shared experts'),
// not C, the experts or their stacked rows of C.
// q_bias and kv_bias: q's and kv's where the block has q, k and v biases, else 0 (not held);
// q_norm and kv_norm likewise where it normalises q and k;
// shared_gate: 1 where the shared experts have a gate, else 0.
enum class Dim {
  none,
  C,
  q,
  qkv,
  fc,
  ffn,
  kv,
  experts,
  experts_fc,
  experts_C,
  shared_ffn,
  q_bias,
  kv_bias,
  q_norm,
  kv_norm,
  shared_gate
};
inline bool split_by_tp(Dim d) {
  return d != Dim::none && d != Dim::C && d != Dim::experts && d != Dim::experts_C && d != Dim::shared_gate;
}

struct BlockTensor {
  const char* name;  // after "h.{i}."
  Dim rows, cols;    // [rows] when cols = none, else [rows, cols]
  bool decay;        // AdamW weight decay (the 2-D weights)
  Init init;
  float* BlockPtrs::*field;  // where its address goes (null: the continuation of the tensor before)
};

inline constexpr BlockTensor kGpt2Block[] = {
    {"ln_1.weight", Dim::C, Dim::none, false, Init::ones, &BlockPtrs::ln1w},
    {"ln_1.bias", Dim::C, Dim::none, false, Init::zeros, &BlockPtrs::ln1b},
    {"attn.c_attn.weight", Dim::qkv, Dim::C, true, Init::normal, &BlockPtrs::qkvw},  // q, k, v packed
    {"attn.c_attn.bias", Dim::qkv, Dim::none, false, Init::zeros, &BlockPtrs::qkvb},
    {"attn.c_proj.weight", Dim::C, Dim::q, true, Init::residual_normal, &BlockPtrs::projw},
    {"attn.c_proj.bias", Dim::C, Dim::none, false, Init::zeros, &BlockPtrs::projb},
    {"ln_2.weight", Dim::C, Dim::none, false, Init::ones, &BlockPtrs::ln2w},
    {"ln_2.bias", Dim::C, Dim::none, false, Init::zeros, &BlockPtrs::ln2b},
    {"mlp.c_fc.weight", Dim::fc, Dim::C, true, Init::normal, &BlockPtrs::fcw},
    {"mlp.c_fc.bias", Dim::fc, Dim::none, false, Init::zeros, &BlockPtrs::fcb},
    {"mlp.c_proj.weight", Dim::C, Dim::ffn, true, Init::residual_normal, &BlockPtrs::fcprojw},
    {"mlp.c_proj.bias", Dim::C, Dim::none, false, Init::zeros, &BlockPtrs::fcprojb},
};

inline constexpr BlockTensor kLlamaBlock[] = {
    {"input_layernorm.weight", Dim::C, Dim::none, false, Init::ones, &BlockPtrs::ln1w},
    {"self_attn.q_proj.weight", Dim::q, Dim::C, true, Init::normal, &BlockPtrs::qkvw},
    {"self_attn.k_proj.weight", Dim::kv, Dim::C, true, Init::normal, nullptr},  // rows of the qkv product
    {"self_attn.v_proj.weight", Dim::kv, Dim::C, true, Init::normal, nullptr},
    {"self_attn.q_proj.bias", Dim::q_bias, Dim::none, false, Init::zeros, &BlockPtrs::qkvb},  // model.attention_bias
    {"self_attn.k_proj.bias", Dim::kv_bias, Dim::none, false, Init::zeros, nullptr},
    {"self_attn.v_proj.bias", Dim::kv_bias, Dim::none, false, Init::zeros, nullptr},
    {"self_attn.q_norm.weight", Dim::q_norm, Dim::none, false, Init::ones, &BlockPtrs::qknormw},  // model.qk_norm
    {"self_attn.k_norm.weight", Dim::kv_norm, Dim::none, false, Init::ones, nullptr},
    {"self_attn.o_proj.weight", Dim::C, Dim::q, true, Init::residual_normal, &BlockPtrs::projw},
    {"post_attention_layernorm.weight", Dim::C, Dim::none, false, Init::ones, &BlockPtrs::ln2w},
    {"mlp.gate_proj.weight", Dim::ffn, Dim::C, true, Init::normal, &BlockPtrs::fcw},
    {"mlp.up_proj.weight", Dim::ffn, Dim::C, true, Init::normal, nullptr},  // rows of the gate | up product
    {"mlp.down_proj.weight", Dim::C, Dim::ffn, true, Init::residual_normal, &BlockPtrs::fcprojw},
};

inline constexpr BlockTensor kLlamaMoeBlock[] = {
    {"input_layernorm.weight", Dim::C, Dim::none, false, Init::ones, &BlockPtrs::ln1w},
    {"self_attn.q_proj.weight", Dim::q, Dim::C, true, Init::normal, &BlockPtrs::qkvw},
    {"self_attn.k_proj.weight", Dim::kv, Dim::C, true, Init::normal, nullptr},
    {"self_attn.v_proj.weight", Dim::kv, Dim::C, true, Init::normal, nullptr},
    {"self_attn.q_proj.bias", Dim::q_bias, Dim::none, false, Init::zeros, &BlockPtrs::qkvb},  // model.attention_bias
    {"self_attn.k_proj.bias", Dim::kv_bias, Dim::none, false, Init::zeros, nullptr},
    {"self_attn.v_proj.bias", Dim::kv_bias, Dim::none, false, Init::zeros, nullptr},
    {"self_attn.q_norm.weight", Dim::q_norm, Dim::none, false, Init::ones, &BlockPtrs::qknormw},  // model.qk_norm
    {"self_attn.k_norm.weight", Dim::kv_norm, Dim::none, false, Init::ones, nullptr},
    {"self_attn.o_proj.weight", Dim::C, Dim::q, true, Init::residual_normal, &BlockPtrs::projw},
    {"post_attention_layernorm.weight", Dim::C, Dim::none, false, Init::ones, &BlockPtrs::ln2w},
    {"mlp.gate.weight", Dim::experts, Dim::C, true, Init::normal, &BlockPtrs::routerw},
    {"mlp.experts.gate_up_proj", Dim::experts_fc, Dim::C, true, Init::normal, &BlockPtrs::fcw},
    {"mlp.experts.down_proj", Dim::experts_C, Dim::ffn, true, Init::residual_normal, &BlockPtrs::fcprojw},
    {"mlp.shared_experts.gate_proj.weight", Dim::shared_ffn, Dim::C, true, Init::normal, &BlockPtrs::sharedw},
    {"mlp.shared_experts.up_proj.weight", Dim::shared_ffn, Dim::C, true, Init::normal, nullptr},
    {"mlp.shared_experts.down_proj.weight", Dim::C, Dim::shared_ffn, true, Init::residual_normal,
     &BlockPtrs::sharedprojw},
    {"mlp.shared_expert_gate.weight", Dim::shared_gate, Dim::C, true, Init::normal, &BlockPtrs::sharedgatew},
};

// A family's block tensors, as a range.
struct BlockTensors {
  const BlockTensor* first;
  const BlockTensor* last;
  const BlockTensor* begin() const { return first; }
  const BlockTensor* end() const { return last; }
  const BlockTensor& front() const { return *first; }
};
inline BlockTensors block_tensors(Arch arch) {
  if (arch == Arch::llama) return {std::begin(kLlamaBlock), std::end(kLlamaBlock)};
  return {std::begin(kGpt2Block), std::end(kGpt2Block)};
}
// The table of a block of shape `s`: its family's, or the MoE block's. A tensor of it with no
// elements in `s` (the shared experts' when there are none) is not held: see held().
inline BlockTensors block_tensors(const BlockShape& s) {
  if (s.moe()) return {std::begin(kLlamaMoeBlock), std::end(kLlamaMoeBlock)};
  return block_tensors(s.arch);
}

inline int extent(Dim d, const BlockShape& s) {
  switch (d) {
    case Dim::none:
      return 1;
    case Dim::C:
      return s.C;
    case Dim::q:
      return s.q;
    case Dim::qkv:
      return s.qkv;
    case Dim::fc:
      return s.fc;
    case Dim::ffn:
      return s.ffn;
    case Dim::kv:
      return s.kv;
    case Dim::experts:
      return s.experts;
    case Dim::experts_fc:
      return s.held_experts * s.fc;
    case Dim::experts_C:
      return s.held_experts * s.C;
    case Dim::shared_ffn:
      return s.shared_ffn;
    case Dim::q_bias:
      return s.qkv_bias ? s.q : 0;
    case Dim::kv_bias:
      return s.qkv_bias ? s.kv : 0;
    case Dim::q_norm:
      return s.qk_norm ? s.q : 0;
    case Dim::kv_norm:
      return s.qk_norm ? s.kv : 0;
    case Dim::shared_gate:
      return s.shared_gate ? 1 : 0;
  }
  return 0;
}
inline std::vector<int> shape_of(const BlockTensor& t, const BlockShape& s) {
  return t.cols == Dim::none ? std::vector<int>{extent(t.rows, s)}
                             : std::vector<int>{extent(t.rows, s), extent(t.cols, s)};
}
// How a split dimension is made of parts that tensor parallelism splits each alike: the packed q,
// k, v product's three (a rank keeps its heads of each), else the dimension whole.
// The experts' stacked gate | up rows: each expert's gate, then its up.
inline std::vector<int> split_groups(Dim d, const BlockShape& whole) {
  if (d == Dim::qkv) return {whole.q, whole.kv, whole.kv};
  if (d == Dim::experts_fc) return std::vector<int>(2 * whole.held_experts, whole.ffn);
  return {extent(d, whole)};
}
inline size_t size_of(const BlockTensor& t, const BlockShape& s) {
  return static_cast<size_t>(extent(t.rows, s)) * extent(t.cols, s);
}
// Whether a block of shape `s` holds `t` (an MoE block without shared experts holds none of theirs).
inline bool held(const BlockTensor& t, const BlockShape& s) { return size_of(t, s) > 0; }

// The global name of a block tensor: "h.3.attn.c_attn.weight".
inline std::string block_tensor_name(int block, const BlockTensor& t) {
  return "h." + std::to_string(block) + "." + t.name;
}

// A block's pointers, its tensors laid out one after another from `first` (the stage's buffers).
inline BlockPtrs block_ptrs_from(float* first, const BlockShape& s) {
  BlockPtrs b;
  for (const BlockTensor& t : block_tensors(s)) {
    if (t.field && held(t, s)) b.*t.field = first;
    first += size_of(t, s);
  }
  return b;
}

}  // namespace pipetrain
