#include "pipetrain/interop/llama_layout.hpp"

#include "pipetrain/interop/gpt2_layout.hpp"
#include "pipetrain/model/block_tensors.hpp"

namespace pipetrain {
namespace {

const std::string kLayers = "model.layers.";
// The tensors outside the blocks, pipetrain's name and Hugging Face's.
const std::pair<const char*, const char*> kTop[] = {{"wte.weight", "model.embed_tokens.weight"},
                                                    {"ln_f.weight", "model.norm.weight"},
                                                    {"lm_head.weight", "lm_head.weight"}};

bool llama_block_tensor(const std::string& tensor) {
  for (const BlockTensor& t : kLlamaBlock)
    if (tensor == t.name) return true;
  return false;
}

}  // namespace

std::string hf_llama_name(const std::string& name) {
  for (auto [ours, theirs] : kTop)
    if (name == ours) return theirs;
  return kLayers + name.substr(2);  // "h.3.x" -> "model.layers.3.x"
}

std::string name_from_hf_llama(const std::string& hf) {
  for (auto [ours, theirs] : kTop)
    if (hf == theirs) return ours;
  if (hf.rfind(kLayers, 0) != 0) return "";
  const std::string name = "h." + hf.substr(kLayers.size());
  int block;
  std::string tensor;
  return split_block_name(name, &block, &tensor) && llama_block_tensor(tensor) ? name : "";
}

}  // namespace pipetrain
