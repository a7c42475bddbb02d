#include "pipetrain/interop/llama_layout.hpp"

#include <iterator>

#include "pipetrain/interop/gpt2_layout.hpp"
#include "pipetrain/model/block_tensors.hpp"

namespace pipetrain {
namespace {

const std::string kLayers = "model.layers.";
// The tensors outside the blocks, pipetrain's name and Hugging Face's.
const std::pair<const char*, const char*> kTop[] = {{"wte.weight", "model.embed_tokens.weight"},
                                                    {"ln_f.weight", "model.norm.weight"},
                                                    {"lm_head.weight", "lm_head.weight"}};
// An MoE block's MLP tensors, pipetrain's name after "h.{i}." and Mixtral's after "model.layers.{i}.".
const std::string kRouter = "mlp.gate.weight", kMixtralRouter = "block_sparse_moe.gate.weight";
const std::string kGateUp = "mlp.experts.gate_up_proj", kDown = "mlp.experts.down_proj";
const std::string kExperts = "block_sparse_moe.experts.";

bool llama_block_tensor(const std::string& tensor) {
  for (const BlockTensor& t : kLlamaMoeBlock)  // the dense block's, and an MoE block's
    if (tensor == t.name) return true;
  for (const BlockTensor& t : kLlamaBlock)
    if (tensor == t.name) return true;
  return false;
}

// "h.3." and "model.layers.3." of "h.3.x".
std::string block_prefix(const std::string& name) { return name.substr(0, name.find('.', 2) + 1); }

}  // namespace

std::string hf_llama_name(const std::string& name) {
  for (auto [ours, theirs] : kTop)
    if (name == ours) return theirs;
  const std::string layer = kLayers + block_prefix(name).substr(2), tensor = name.substr(block_prefix(name).size());
  if (tensor == kRouter) return layer + kMixtralRouter;
  if (tensor == kGateUp) return layer + kExperts + "{e}.w1.weight and w3.weight";
  if (tensor == kDown) return layer + kExperts + "{e}.w2.weight";
  return kLayers + name.substr(2);  // "h.3.x" -> "model.layers.3.x"
}

std::vector<HfPart> hf_llama_parts(const std::string& name, const std::vector<int64_t>& shape, int experts) {
  const std::string tensor = name.substr(block_prefix(name).size());
  if (name.rfind("h.", 0) != 0 || (tensor != kGateUp && tensor != kDown) || experts == 0)
    return {{hf_llama_name(name), 0, shape[0]}};
  const std::string experts_at = kLayers + block_prefix(name).substr(2) + kExperts;
  const int64_t per_expert = shape[0] / experts;  // 2 ffn (gate | up) or d_model (down)
  std::vector<HfPart> parts;
  for (int e = 0; e < experts; ++e) {
    const std::string at = experts_at + std::to_string(e) + ".";
    if (tensor == kDown) {
      parts.push_back({at + "w2.weight", e * per_expert, per_expert});
      continue;
    }
    parts.push_back({at + "w1.weight", e * per_expert, per_expert / 2});
    parts.push_back({at + "w3.weight", e * per_expert + per_expert / 2, per_expert / 2});
  }
  return parts;
}

HfPart part_from_hf_llama(const std::string& hf, int64_t rows) {
  for (auto [ours, theirs] : kTop)
    if (hf == theirs) return {ours, 0, rows};
  if (hf.rfind(kLayers, 0) != 0) return {};
  const std::string name = "h." + hf.substr(kLayers.size());
  int block;
  std::string tensor;
  if (!split_block_name(name, &block, &tensor)) return {};
  const std::string h = "h." + std::to_string(block) + ".";
  if (tensor == kMixtralRouter) return {h + kRouter, 0, rows};
  if (tensor.rfind(kExperts, 0) == 0) {  // experts.{e}.w1.weight: expert e's gate rows, and so on
    const std::string rest = tensor.substr(kExperts.size());
    const size_t dot = rest.find('.');
    if (dot == std::string::npos || dot == 0 || rest.find_first_not_of("0123456789") != dot) return {};
    const int64_t e = std::stoll(rest.substr(0, dot));
    const std::string matrix = rest.substr(dot + 1);
    if (matrix == "w1.weight") return {h + kGateUp, 2 * e * rows, rows};
    if (matrix == "w3.weight") return {h + kGateUp, (2 * e + 1) * rows, rows};
    if (matrix == "w2.weight") return {h + kDown, e * rows, rows};
    return {};
  }
  return llama_block_tensor(tensor) ? HfPart{name, 0, rows} : HfPart{};
}

}  // namespace pipetrain
