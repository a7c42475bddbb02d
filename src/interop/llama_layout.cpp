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
// An MoE block's MLP tensors, pipetrain's name after "h.{i}.", and where a Hugging Face family puts
// them after "model.layers.{i}.": the router, expert e's matrices under experts + "{e}.", the shared
// experts.
const std::string kRouter = "mlp.gate.weight", kGateUp = "mlp.experts.gate_up_proj", kDown = "mlp.experts.down_proj";
const std::string kShared = "mlp.shared_experts.";
struct MoeNames {
  std::string router, experts, gate, up, down, shared;
};
const MoeNames kMixtral{
    "block_sparse_moe.gate.weight", "block_sparse_moe.experts.", "w1.weight", "w3.weight", "w2.weight", kShared};
const MoeNames kQwenMoe{kRouter,          "mlp.experts.",     "gate_proj.weight",
                        "up_proj.weight", "down_proj.weight", "mlp.shared_expert."};

bool llama_block_tensor(const std::string& tensor) {
  for (const BlockTensor& t : kLlamaMoeBlock)  // the dense block's, and an MoE block's
    if (tensor == t.name) return true;
  for (const BlockTensor& t : kLlamaBlock)
    if (tensor == t.name) return true;
  return false;
}

// "h.3." and "model.layers.3." of "h.3.x".
std::string block_prefix(const std::string& name) { return name.substr(0, name.find('.', 2) + 1); }

std::string moe_name(const std::string& name, const MoeNames& n) {
  for (auto [ours, theirs] : kTop)
    if (name == ours) return theirs;
  const std::string layer = kLayers + block_prefix(name).substr(2), tensor = name.substr(block_prefix(name).size());
  if (tensor == kRouter) return layer + n.router;
  if (tensor == kGateUp) return layer + n.experts + "{e}." + n.gate + " and " + n.up;
  if (tensor == kDown) return layer + n.experts + "{e}." + n.down;
  if (tensor.rfind(kShared, 0) == 0) return layer + n.shared + tensor.substr(kShared.size());
  return kLayers + name.substr(2);  // "h.3.x" -> "model.layers.3.x"
}

std::vector<HfPart> moe_parts(const std::string& name, const std::vector<int64_t>& shape, int experts,
                              const MoeNames& n) {
  const std::string tensor = name.substr(block_prefix(name).size());
  if (name.rfind("h.", 0) != 0 || (tensor != kGateUp && tensor != kDown) || experts == 0)
    return {{moe_name(name, n), 0, shape[0]}};
  const std::string experts_at = kLayers + block_prefix(name).substr(2) + n.experts;
  const int64_t per_expert = shape[0] / experts;  // 2 ffn (gate | up) or d_model (down)
  std::vector<HfPart> parts;
  for (int e = 0; e < experts; ++e) {
    const std::string at = experts_at + std::to_string(e) + ".";
    if (tensor == kDown) {
      parts.push_back({at + n.down, e * per_expert, per_expert});
      continue;
    }
    parts.push_back({at + n.gate, e * per_expert, per_expert / 2});
    parts.push_back({at + n.up, e * per_expert + per_expert / 2, per_expert / 2});
  }
  return parts;
}

// Expert e's matrix `matrix` under a family's names: its rows of pipetrain's stacked tensor.
HfPart expert_part(const std::string& h, int64_t e, const std::string& matrix, int64_t rows, const MoeNames& n) {
  if (matrix == n.gate) return {h + kGateUp, 2 * e * rows, rows};
  if (matrix == n.up) return {h + kGateUp, (2 * e + 1) * rows, rows};
  if (matrix == n.down) return {h + kDown, e * rows, rows};
  return {};
}

}  // namespace

std::string hf_llama_name(const std::string& name) { return moe_name(name, kMixtral); }
std::string hf_qwen_moe_name(const std::string& name) { return moe_name(name, kQwenMoe); }

std::vector<HfPart> hf_llama_parts(const std::string& name, const std::vector<int64_t>& shape, int experts) {
  return moe_parts(name, shape, experts, kMixtral);
}
std::vector<HfPart> hf_qwen_moe_parts(const std::string& name, const std::vector<int64_t>& shape, int experts) {
  return moe_parts(name, shape, experts, kQwenMoe);
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
  for (const MoeNames* n : {&kMixtral, &kQwenMoe}) {
    if (tensor == n->router) return {h + kRouter, 0, rows};
    if (tensor.rfind(n->shared, 0) == 0) return {h + kShared + tensor.substr(n->shared.size()), 0, rows};
    if (tensor.rfind(n->experts, 0) != 0) continue;
    // experts.{e}.w1.weight (Mixtral's; gate_proj.weight, Qwen-MoE's): expert e's gate rows, and so on
    const std::string rest = tensor.substr(n->experts.size());
    const size_t dot = rest.find('.');
    if (dot == std::string::npos || dot == 0 || rest.find_first_not_of("0123456789") != dot) return {};
    return expert_part(h, std::stoll(rest.substr(0, dot)), rest.substr(dot + 1), rows, *n);
  }
  return llama_block_tensor(tensor) ? HfPart{name, 0, rows} : HfPart{};
}

}  // namespace pipetrain
