#include "pipetrain/interop/hf_family.hpp"

#include <iterator>

#include "pipetrain/interop/gpt2_layout.hpp"
#include "pipetrain/interop/llama_layout.hpp"
#include "pipetrain/interop/weights_source.hpp"
#include "pipetrain/model/block_tensors.hpp"

using json = nlohmann::json;

namespace pipetrain {
namespace {

json token_id(const SpecialTokens::Token& t) { return t.id >= 0 ? json(t.id) : json(nullptr); }

// The Hugging Face configuration of a LlamaForCausalLM computing what pipetrain's llama family
// computes: SiLU-gated MLP, RMSNorm, plain rotary embeddings (no scaling), no biases, no dropout.
json hf_llama_config(const RunSpec& spec, StoredFloat dtype, const SpecialTokens& special) {
  const auto& m = spec.model;
  const BlockShape s = block_shape(spec);
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", m.vocab},
          {"hidden_size", m.d_model},
          {"intermediate_size", s.ffn},
          {"num_hidden_layers", m.n_layer},
          {"num_attention_heads", m.n_head},
          {"num_key_value_heads", s.NKV},
          {"head_dim", s.head_dim},
          {"hidden_act", "silu"},
          {"max_position_embeddings", m.seq_len},
          {"rms_norm_eps", m.norm_eps},
          {"rope_theta", m.rope_theta},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"pretraining_tp", 1},
          {"initializer_range", 0.02},
          {"use_cache", true},
          {"tie_word_embeddings", m.tie_embeddings},
          {"bos_token_id", token_id(special.bos)},
          {"eos_token_id", token_id(special.eos)},
          {"torch_dtype", dtype == StoredFloat::bf16 ? "bfloat16" : "float32"}};
}

// The Hugging Face configuration of a GPT2LMHeadModel computing what pipetrain computes: pre-LN
// blocks with GELU (tanh), LayerNorm eps 1e-5, attention scaled by 1/sqrt(head_dim), no dropout
// (pipetrain trains without it); the special tokens are the tokenizer's (none for bytes).
json hf_gpt2_config(const RunSpec& spec, StoredFloat dtype, const SpecialTokens& special) {
  const auto& m = spec.model;
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", m.vocab},
          {"n_positions", m.seq_len},
          {"n_ctx", m.seq_len},
          {"n_embd", m.d_model},
          {"n_layer", m.n_layer},
          {"n_head", m.n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"initializer_range", 0.02},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"use_cache", true},
          {"tie_word_embeddings", m.tie_embeddings},
          {"bos_token_id", token_id(special.bos)},
          {"eos_token_id", token_id(special.eos)},
          {"torch_dtype", dtype == StoredFloat::bf16 ? "bfloat16" : "float32"}};
}

// The keys each Hugging Face mixture of experts shares, `experts` the one naming their count.
void add_moe_keys(json& c, const RunSpec& spec, const char* experts) {
  const auto& moe = spec.model.moe;
  c[experts] = moe.experts;
  c["num_experts_per_tok"] = moe.top_k;
  c["router_aux_loss_coef"] = moe.aux_loss;
  c["output_router_logits"] = false;
}

// A MixtralForCausalLM: the llama block with every MLP a mixture of experts as wide as
// intermediate_size, each token to num_experts_per_tok of them, their weights renormalised.
json hf_mixtral_config(const RunSpec& spec, StoredFloat dtype, const SpecialTokens& special) {
  json c = hf_llama_config(spec, dtype, special);
  const auto& moe = spec.model.moe;
  c["architectures"] = {"MixtralForCausalLM"};
  c["model_type"] = "mixtral";
  c["intermediate_size"] = block_shape(spec, moe.every - 1).ffn;
  add_moe_keys(c, spec, "num_local_experts");
  c["router_jitter_noise"] = 0.0;
  c["sliding_window"] = nullptr;
  for (const char* llama_only : {"attention_bias", "mlp_bias", "pretraining_tp", "rope_scaling"}) c.erase(llama_only);
  return c;
}

// A Qwen2ForCausalLM: the llama block with q, k and v biases, no sliding window.
json hf_qwen2_config(const RunSpec& spec, StoredFloat dtype, const SpecialTokens& special) {
  json c = hf_llama_config(spec, dtype, special);
  c["architectures"] = {"Qwen2ForCausalLM"};
  c["model_type"] = "qwen2";
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  for (const char* llama_only : {"attention_bias", "mlp_bias", "pretraining_tp", "head_dim"}) c.erase(llama_only);
  return c;
}

// A Qwen2MoeForCausalLM: the Qwen2 block whose MLP, every decoder_sparse_step-th block, is a
// mixture of experts with one gated shared expert of its own width; the other blocks' MLPs dense.
json hf_qwen_moe_config(const RunSpec& spec, StoredFloat dtype, const SpecialTokens& special) {
  json c = hf_qwen2_config(spec, dtype, special);
  const auto& moe = spec.model.moe;
  const BlockShape s = block_shape(spec, moe.every - 1);
  c["architectures"] = {"Qwen2MoeForCausalLM"};
  c["model_type"] = "qwen2_moe";
  c["decoder_sparse_step"] = moe.every;
  c["mlp_only_layers"] = json::array();
  c["moe_intermediate_size"] = s.ffn;
  c["shared_expert_intermediate_size"] = s.shared_ffn;
  add_moe_keys(c, spec, "num_experts");
  c["norm_topk_prob"] = moe.norm_topk;
  return c;
}

// An OlmoeForCausalLM: the llama block with OLMo's QK-norm, every MLP a mixture of experts as wide
// as intermediate_size, top-k as norm_topk_prob says, no shared experts.
json hf_olmoe_config(const RunSpec& spec, StoredFloat dtype, const SpecialTokens& special) {
  json c = hf_llama_config(spec, dtype, special);
  const auto& moe = spec.model.moe;
  c["architectures"] = {"OlmoeForCausalLM"};
  c["model_type"] = "olmoe";
  c["intermediate_size"] = block_shape(spec, moe.every - 1).ffn;
  add_moe_keys(c, spec, "num_experts");
  c["norm_topk_prob"] = moe.norm_topk;
  c["clip_qkv"] = nullptr;
  for (const char* llama_only : {"mlp_bias", "pretraining_tp", "head_dim"}) c.erase(llama_only);
  return c;
}

bool never_transposed(const std::string&) { return false; }

std::vector<HfPart> whole_tensor(const std::string& ours, const std::vector<int64_t>& shape, int) {
  return {{hf_name(ours), 0, shape[0]}};
}

std::string holds_any(const RunSpec&) { return ""; }

// A Llama's or Qwen2's block has no q and k norms (OLMo 2's, which has, also moves its block norms).
std::string llama_cannot_hold(const RunSpec& spec) {
  return spec.model.qk_norm ? "model.qk_norm: the block has no q and k norms" : "";
}

// Mixtral's MoE: every block, top-k renormalised, dropless, no shared experts.
std::string mixtral_cannot_hold(const RunSpec& spec) {
  const auto& moe = spec.model.moe;
  const std::pair<const char*, const char*> unheld[] = {
      {moe.shared_experts > 0 ? "model.moe.shared_experts" : nullptr, "Mixtral has no shared experts"},
      {!moe.norm_topk ? "model.moe.norm_topk" : nullptr, "Mixtral always renormalises the chosen experts' weights"},
      {moe.every != 1 ? "model.moe.every" : nullptr, "every Mixtral block is an MoE block"},
      {moe.capacity_factor > 0 ? "model.moe.capacity_factor" : nullptr, "Mixtral is dropless"}};
  for (auto [key, why] : unheld)
    if (key) return std::string(key) + ": " + why;
  if (spec.model.attention_bias) return "model.attention_bias: Mixtral's q, k and v products have no biases";
  return llama_cannot_hold(spec);
}

// OLMoE's: q and k norms, every block an MoE block, no shared experts, no biases, dropless.
std::string olmoe_cannot_hold(const RunSpec& spec) {
  const auto& moe = spec.model.moe;
  const std::pair<const char*, const char*> unheld[] = {
      {!spec.model.qk_norm ? "model.qk_norm" : nullptr, "OLMoE normalises q and k"},
      {moe.shared_experts > 0 ? "model.moe.shared_experts" : nullptr, "OLMoE has no shared experts"},
      {moe.every != 1 ? "model.moe.every" : nullptr, "every OLMoE block is an MoE block"},
      {spec.model.attention_bias ? "model.attention_bias" : nullptr, "OLMoE's q, k and v products have no biases"},
      {moe.capacity_factor > 0 ? "model.moe.capacity_factor" : nullptr, "OLMoE is dropless"}};
  for (auto [key, why] : unheld)
    if (key) return std::string(key) + ": " + why;
  return "";
}

// Qwen2-MoE's: one shared expert with its gate, q, k and v biases, dropless.
std::string qwen_moe_cannot_hold(const RunSpec& spec) {
  const auto& moe = spec.model.moe;
  const std::pair<const char*, const char*> unheld[] = {
      {moe.shared_experts == 0 ? "model.moe.shared_experts" : nullptr, "Qwen2-MoE's blocks have a shared expert"},
      {!moe.shared_gate ? "model.moe.shared_gate" : nullptr, "Qwen2-MoE's shared expert always has its gate"},
      {!spec.model.attention_bias ? "model.attention_bias" : nullptr, "Qwen2-MoE's q, k and v products have biases"},
      {moe.capacity_factor > 0 ? "model.moe.capacity_factor" : nullptr, "Qwen2-MoE is dropless"}};
  for (auto [key, why] : unheld)
    if (key) return std::string(key) + ": " + why;
  return llama_cannot_hold(spec);
}

const HfFamily kFamilies[] = {
    {Arch::gpt2, false, "gpt2", "GPT-2", hf_name, hf_transposed, whole_tensor, holds_any, hf_gpt2_config, open_hf_gpt2,
     true},
    {Arch::llama, false, "llama", "Llama", hf_llama_name, never_transposed, hf_llama_parts, llama_cannot_hold,
     hf_llama_config, open_hf_llama, false},
    {Arch::llama, true, "mixtral", "Mixtral", hf_llama_name, never_transposed, hf_llama_parts, mixtral_cannot_hold,
     hf_mixtral_config, open_hf_llama, false},
    {Arch::llama, false, "qwen2", "Qwen2", hf_llama_name, never_transposed, hf_llama_parts, llama_cannot_hold,
     hf_qwen2_config, open_hf_llama, false},
    {Arch::llama, true, "qwen2_moe", "Qwen2-MoE", hf_qwen_moe_name, never_transposed, hf_qwen_moe_parts,
     qwen_moe_cannot_hold, hf_qwen_moe_config, open_hf_llama, false},
    {Arch::llama, true, "olmoe", "OLMoE", hf_qwen_moe_name, never_transposed, hf_qwen_moe_parts, olmoe_cannot_hold,
     hf_olmoe_config, open_hf_llama, false},
};

}  // namespace

const HfFamily& hf_family(const RunSpec& spec) {
  const bool qwen2 = spec.model.arch == Arch::llama && !spec.model.moe.on() && spec.model.attention_bias;
  if (qwen2) return *hf_family_of_type("qwen2");
  if (spec.model.moe.on() && spec.model.moe.shared_gate) return *hf_family_of_type("qwen2_moe");
  if (spec.model.moe.on() && spec.model.qk_norm) return *hf_family_of_type("olmoe");
  for (const HfFamily& f : kFamilies)
    if (f.arch == spec.model.arch && f.moe == spec.model.moe.on()) return f;
  throw std::logic_error("no Hugging Face layout for model.arch #" + std::to_string(static_cast<int>(spec.model.arch)));
}

const HfFamily& hf_family(Arch arch) {
  for (const HfFamily& f : kFamilies)
    if (f.arch == arch && !f.moe) return f;
  throw std::logic_error("no Hugging Face layout for model.arch #" + std::to_string(static_cast<int>(arch)));
}

const HfFamily* hf_family_of_type(const std::string& model_type) {
  for (const HfFamily& f : kFamilies)
    if (model_type == f.model_type) return &f;
  return nullptr;
}

std::string hf_family_types() {
  std::string out;
  const size_t n = std::size(kFamilies);
  for (size_t i = 0; i < n; ++i)
    out += std::string(i == 0       ? ""
                       : i + 1 == n ? " and "
                                    : ", ") +
           kFamilies[i].name + " (\"" + kFamilies[i].model_type + "\")";
  return out;
}

}  // namespace pipetrain
