// How the llama family's parameters (design.md "Model and parameter names") appear in a Hugging
// Face LlamaForCausalLM, derived from the one table of its block's tensors (kLlamaBlock): the
// embedding is "model.embed_tokens.weight", block i's tensors keep their names under
// "model.layers.{i}." (pipetrain's are Hugging Face's after "h.{i}."), the final norm is
// "model.norm.weight", the head "lm_head.weight" (stored only when untied). Layouts are the same:
// nn.Linear [out, in], rotary embeddings in the rotate-half convention, q heads as contiguous slices.
//
// A mixture of experts appears as a MixtralForCausalLM: an MoE block's router is
// "model.layers.{i}.block_sparse_moe.gate.weight", and its stacked experts are cut expert by
// expert: expert e's gate rows of mlp.experts.gate_up_proj are "...block_sparse_moe.experts.{e}.w1.weight",
// its up rows "...w3.weight", its rows of mlp.experts.down_proj "...w2.weight". Or, with a gated
// shared expert, as a Qwen2MoeForCausalLM: the router "model.layers.{i}.mlp.gate.weight", expert
// e's "...mlp.experts.{e}.gate_proj.weight", "up_proj.weight", "down_proj.weight", the shared
// experts "...mlp.shared_expert.{gate,up,down}_proj.weight" and their gate
// "...mlp.shared_expert_gate.weight".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

// "model.layers.3.self_attn.q_proj.weight" for "h.3.self_attn.q_proj.weight" (a stacked expert
// tensor: its parts' names with {e} for the expert, for messages).
std::string hf_llama_name(const std::string& name);
std::string hf_qwen_moe_name(const std::string& name);  // the same in a Qwen2MoeForCausalLM

// A run of rows of a pipetrain tensor stored as one Hugging Face tensor.
struct HfPart {
  std::string name;  // Hugging Face's (pipetrain's, from part_from_hf_llama)
  int64_t first_row = 0, rows = 0;
};
// The Hugging Face tensors pipetrain tensor `name` of `shape` is stored as: itself, or an MoE
// block's stacked experts (`experts` of them) one part per expert and matrix.
std::vector<HfPart> hf_llama_parts(const std::string& name, const std::vector<int64_t>& shape, int experts);
std::vector<HfPart> hf_qwen_moe_parts(const std::string& name, const std::vector<int64_t>& shape, int experts);
// The pipetrain tensor a Hugging Face Llama, Mixtral or Qwen-MoE tensor of `rows` rows is (a part of), and
// where its rows start there; name "" for one pipetrain has no use for (a stored rotary frequency
// table, say) or does not know.
HfPart part_from_hf_llama(const std::string& hf, int64_t rows);

}  // namespace pipetrain
