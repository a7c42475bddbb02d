// How the llama family's parameters (design.md "Model and parameter names") appear in a Hugging
// Face LlamaForCausalLM, derived from the one table of its block's tensors (kLlamaBlock): the
// embedding is "model.embed_tokens.weight", block i's tensors keep their names under
// "model.layers.{i}." (pipetrain's are Hugging Face's after "h.{i}."), the final norm is
// "model.norm.weight", the head "lm_head.weight" (stored only when untied). Layouts are the same:
// nn.Linear [out, in], rotary embeddings in the rotate-half convention, q heads as contiguous slices.
#pragma once
#include <string>

namespace pipetrain {

// "model.layers.3.self_attn.q_proj.weight" for "h.3.self_attn.q_proj.weight".
std::string hf_llama_name(const std::string& name);
// The pipetrain name of a Hugging Face Llama tensor; "" for one pipetrain has no use for (a stored
// rotary frequency table, say) or does not know.
std::string name_from_hf_llama(const std::string& hf);

}  // namespace pipetrain
