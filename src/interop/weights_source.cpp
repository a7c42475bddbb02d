#include "pipetrain/interop/weights_source.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipetrain/ckpt/manifest.hpp"
#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/config/spec_schema.hpp"
#include "pipetrain/interop/gpt2_layout.hpp"
#include "pipetrain/interop/hf_family.hpp"
#include "pipetrain/interop/llama_layout.hpp"
#include "pipetrain/interop/llmc_model.hpp"
#include "pipetrain/interop/safetensors.hpp"
#include "pipetrain/model/block_tensors.hpp"
#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain {
namespace {

// The shortest text that reads back as `v` (1e-06, not 9.9999999999999995e-07), a TOML float.
std::string toml_number(double v) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string t = buf;
  if (t.find_first_of(".eEn") == std::string::npos) t += ".0";
  return t;
}

// A config.json's integer key as a declared spec key (nothing when absent; SpecError when not an
// integer).
void declare_int(std::vector<DeclaredKey>& out, const json& c, const std::string& config, const char* theirs,
                 const char* ours) {
  if (!c.contains(theirs) || c[theirs].is_null()) return;
  if (!c[theirs].is_number_integer())
    throw SpecError(config + ": " + theirs + " = " + c[theirs].dump() + ": not an integer");
  out.push_back({ours, std::to_string(c[theirs].get<int64_t>()), "config.json " + std::string(theirs)});
}

// kind()'s note for a config.json that ties the head of a file holding one: as Hugging Face builds
// that model, the file's lm_head.weight is not used.
constexpr const char* kUnusedHead = ", its lm_head.weight unused (config.json ties the head to the embeddings)";

// What a source without a config says by its tensors' shapes alone: the embedding's rows and
// columns, the blocks it holds (a head of its own or not is the import's tying rule).
std::vector<DeclaredKey> declared_by_shapes(const WeightsSource& s, Arch arch) {
  std::vector<DeclaredKey> out = {{"model.arch", "\"" + std::string(name_of(arch)) + "\"", "its tensor names"}};
  if (const auto wte = s.shape("wte.weight"); wte && wte->size() == 2) {
    out.push_back({"model.vocab", std::to_string((*wte)[0]), "tensor " + s.own_name("wte.weight") + "'s rows"});
    out.push_back({"model.d_model", std::to_string((*wte)[1]), "tensor " + s.own_name("wte.weight") + "'s columns"});
  }
  int blocks = 0;
  while (s.shape(block_tensor_name(blocks, block_tensors(arch).front()))) ++blocks;
  out.push_back({"model.n_layer", std::to_string(blocks),
                 "its blocks (" + s.own_name(block_tensor_name(0, block_tensors(arch).front())) + ", ...)"});
  return out;
}

// A Hugging Face directory's config.json, read once.
json read_hf_config(const std::string& path) {
  try {
    return json::parse(read_input_file(path, "Hugging Face config", 1 << 20));
  } catch (const json::exception& e) {
    throw SpecError(path + ": not valid JSON (" + e.what() + ")");
  }
}

// model.safetensors (GPT2LMHeadModel's names, or GPT2Model's without "transformer."), in a
// directory or alone, with the directory's config.json when there is one (`config`, read from
// `config_path`): what it declares must be the block pipetrain computes.
class HfSource : public WeightsSource {
 public:
  HfSource(const std::string& path, const std::string& file, bool directory, const json* config,
           const std::string& config_path)
      : WeightsSource(path), st_(file), directory_(directory) {
    for (const SafetensorsEntry& e : st_.entries()) {
      const std::string name = name_from_hf(e.name);
      if (!name.empty() && !by_name_.count(name)) by_name_[name] = &e;
    }
    if (by_name_.empty()) throw SpecError(file + ": holds no GPT-2 tensors (transformer.wte.weight, ...)");
    if (config) {
      check_config(*config, config_path);
    } else {  // a bare file: what its tensors' shapes say
      declared_ = declared_by_shapes(*this, Arch::gpt2);
    }
  }

  std::string kind() const override {
    const auto wte = by_name_.find("wte.weight");
    return std::string(directory_ ? "Hugging Face GPT-2 directory" : "safetensors file") +
           (wte == by_name_.end() ? "" : ", " + wte->second->dtype) + (unused_head_ ? kUnusedHead : "");
  }
  std::vector<DeclaredKey> declared() const override { return declared_; }
  std::string own_name(const std::string& name) const override { return hf_name(name); }

  std::optional<std::vector<int64_t>> shape(const std::string& name) const override {
    auto it = by_name_.find(name);
    if (it == by_name_.end() || (tied_ && name == "lm_head.weight")) return std::nullopt;
    std::vector<int64_t> s = it->second->shape;
    if (hf_transposed(name) && s.size() == 2) std::swap(s[0], s[1]);
    return s;
  }

  void read(const std::string& name, float* out) const override {
    const SafetensorsEntry& e = *by_name_.at(name);
    if (!hf_transposed(name) || e.shape.size() != 2) return st_.read(e, out);
    std::vector<float> conv1d(static_cast<size_t>(e.shape[0] * e.shape[1]));  // [in, out]
    st_.read(e, conv1d.data());
    transpose(conv1d.data(), e.shape[0], e.shape[1], out);
  }

 private:
  // What the config declares must agree with pipetrain's block: a GPT-2, GELU with the tanh
  // approximation, LayerNorm eps 1e-5. Its shape keys are declared for the caller to match.
  void check_config(const json& c, const std::string& config) {
    auto refuse = [&](const std::string& key, const std::string& why) {
      throw SpecError(config + ": " + key + " = " + c[key].dump() + ": " + why);
    };
    if (c.contains("activation_function") && c["activation_function"] != "gelu_new" &&
        c["activation_function"] != "gelu_pytorch_tanh")
      refuse("activation_function", "pipetrain's blocks use gelu_new (GELU, tanh approximation)");
    if (c.contains("layer_norm_epsilon") &&
        (!c["layer_norm_epsilon"].is_number() || std::abs(c["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12))
      refuse("layer_norm_epsilon", "pipetrain's LayerNorm uses 1e-5");
    declared_.push_back({"model.arch", "\"gpt2\"", "config.json model_type"});
    declare_int(declared_, c, config, "n_layer", "model.n_layer");
    declare_int(declared_, c, config, "n_embd", "model.d_model");
    declare_int(declared_, c, config, "n_head", "model.n_head");
    declare_int(declared_, c, config, "vocab_size", "model.vocab");
    // GPT2Config ties the head unless told otherwise; a tied model's lm_head.weight is not used.
    if (c.contains("tie_word_embeddings") && !c["tie_word_embeddings"].is_boolean())
      refuse("tie_word_embeddings", "not true or false");
    tied_ = c.value("tie_word_embeddings", true);
    unused_head_ = tied_ && by_name_.count("lm_head.weight");
    declared_.push_back({"model.tie_embeddings", tied_ ? "true" : "false", "config.json tie_word_embeddings"});
  }

  SafetensorsFile st_;
  bool directory_;
  bool tied_ = false, unused_head_ = false;
  std::vector<DeclaredKey> declared_;
  std::map<std::string, const SafetensorsEntry*> by_name_;
};

// A Hugging Face LlamaForCausalLM directory: config.json (model_type llama) and model.safetensors,
// or the shards model.safetensors.index.json maps each tensor to; or a MixtralForCausalLM (model_type
// mixtral) or Qwen2MoeForCausalLM (qwen2_moe), whose experts' matrices are parts of pipetrain's
// stacked ones (llama_layout.hpp); or a Qwen2ForCausalLM (qwen2).
// Tensors are F32, BF16 or F16 in pipetrain's layout already; the config must describe the block
// pipetrain computes.
class HfLlamaSource : public WeightsSource {
 public:
  HfLlamaSource(const std::string& dir, const json& config, const std::string& config_path)
      : WeightsSource(dir),
        mixtral_(config.value("model_type", "") == "mixtral"),
        qwen_moe_(config.value("model_type", "") == "qwen2_moe"),
        olmoe_(config.value("model_type", "") == "olmoe"),
        qwen2_(qwen_moe_ || config.value("model_type", "") == "qwen2") {
    check_config(config, config_path);
    const std::string index = dir + "/model.safetensors.index.json";
    std::map<std::string, std::string> file_of;  // Hugging Face name -> its file
    if (fs::exists(index)) {
      json j;
      try {
        j = json::parse(read_input_file(index, "safetensors index", 1 << 26));
        for (auto& [name, file] : j.at("weight_map").items()) file_of[name] = file.get<std::string>();
      } catch (const json::exception& e) {
        throw SpecError(index + ": not a safetensors index (a \"weight_map\" of tensor -> file): " + e.what());
      }
    } else {
      files_["model.safetensors"] = std::make_unique<SafetensorsFile>(dir + "/model.safetensors");
      for (const SafetensorsEntry& e : files_["model.safetensors"]->entries()) file_of[e.name] = "model.safetensors";
    }
    for (const auto& [hf, file] : file_of) {
      if (file.find('/') != std::string::npos || file.empty())
        throw SpecError(index + ": " + hf + " is in \"" + file + "\": shards must lie beside the index");
      auto& shard = files_[file];
      if (!shard) {
        if (!fs::exists(dir + "/" + file)) throw SpecError(index + ": lists " + file + ", which is not in " + dir);
        shard = std::make_unique<SafetensorsFile>(dir + "/" + file);
      }
      const SafetensorsEntry* e = shard->find(hf);
      if (!e) throw SpecError(index + ": maps " + hf + " to " + file + ", which does not hold it");
      const HfPart part = part_from_hf_llama(hf, e->shape.empty() ? 0 : e->shape[0]);
      if (!part.name.empty()) by_name_[part.name].push_back({e, shard.get(), part.first_row});
    }
    if (by_name_.empty()) throw SpecError(dir + ": holds no Llama tensors (model.embed_tokens.weight, ...)");
    check_parts(dir);
  }

  std::string kind() const override {
    const auto wte = by_name_.find("wte.weight");
    return "Hugging Face " +
           std::string(mixtral_    ? "Mixtral"
                       : qwen_moe_ ? "Qwen2-MoE"
                       : olmoe_    ? "OLMoE"
                       : qwen2_    ? "Qwen2"
                                   : "Llama") +
           " directory" + std::string(files_.size() > 1 ? ", sharded" : "") +
           (wte == by_name_.end() ? "" : ", " + wte->second.front().entry->dtype) +
           (tied_ && by_name_.count("lm_head.weight") ? kUnusedHead : "");
  }
  std::vector<DeclaredKey> declared() const override { return declared_; }
  std::string own_name(const std::string& name) const override {
    return qwen_moe_ || olmoe_ ? hf_qwen_moe_name(name) : hf_llama_name(name);
  }

  std::optional<std::vector<int64_t>> shape(const std::string& name) const override {
    auto it = by_name_.find(name);
    if (it == by_name_.end() || (tied_ && name == "lm_head.weight")) return std::nullopt;
    const std::vector<Held>& parts = it->second;
    if (parts.size() == 1) return parts.front().entry->shape;
    const Held& last = parts.back();  // a stacked tensor: its parts' rows one after another
    return std::vector<int64_t>{last.first_row + last.entry->shape[0], last.entry->shape[1]};
  }
  void read(const std::string& name, float* out) const override {
    for (const Held& h : by_name_.at(name)) {
      const int64_t cols = h.entry->shape.size() > 1 ? h.entry->shape[1] : 1;
      h.file->read(*h.entry, out + h.first_row * cols);
    }
  }

 private:
  // A stacked tensor's parts (a Mixtral's experts) must be matrices of one width that tile its rows.
  void check_parts(const std::string& dir) {
    for (auto& [name, parts] : by_name_) {
      if (parts.size() == 1 && parts.front().first_row == 0) continue;  // a tensor of its own
      std::sort(parts.begin(), parts.end(), [](const Held& a, const Held& b) { return a.first_row < b.first_row; });
      int64_t next = 0;
      for (const Held& h : parts) {
        const bool fits =
            h.entry->shape.size() == 2 && h.first_row == next && h.entry->shape[1] == parts.front().entry->shape[1];
        if (!fits)
          throw SpecError(dir + ": " + h.entry->name + " does not fit beside the other parts of " +
                          hf_llama_name(name) + " (each expert's matrices of one shape, experts 0, 1, ... each once)");
        next += h.entry->shape[0];
      }
    }
  }

  // What pipetrain's llama block computes: SiLU gating, plain rotary embeddings, no biases.
  void check_config(const json& c, const std::string& path) {
    auto refuse = [&](const char* key, const std::string& why) {
      throw SpecError(path + ": " + key + " = " + c[key].dump() + ": " + why);
    };
    auto number = [&](const char* key, double fallback) {
      if (!c.contains(key) || c[key].is_null()) return fallback;
      if (!c[key].is_number()) refuse(key, "not a number");
      return c[key].get<double>();
    };
    if (c.contains("hidden_act") && c["hidden_act"] != "silu")
      refuse("hidden_act", "pipetrain's SwiGLU gates with silu");
    if (c.contains("rope_scaling") && !c["rope_scaling"].is_null())
      refuse("rope_scaling",
             "pipetrain's rotary embeddings are unscaled (Llama 3.1's and YaRN's scaling are not built)");
    for (const char* bias : {"attention_bias", "mlp_bias"})  // Llama's attention_bias puts one on o_proj too
      if (c.contains(bias) && c[bias] != false)
        refuse(bias, "pipetrain's llama block has biases on q, k and v only (model.attention_bias, Qwen2's)");
    if (c.contains("use_sliding_window") && c["use_sliding_window"] != false)
      refuse("use_sliding_window", "pipetrain's attention sees the whole sequence (sliding windows are not built)");
    if (!qwen2_ && c.contains("sliding_window") && !c["sliding_window"].is_null())  // Qwen2: use_sliding_window
      refuse("sliding_window", "pipetrain's attention sees the whole sequence (sliding windows are not built)");
    if (number("router_jitter_noise", 0) != 0)
      refuse("router_jitter_noise", "pipetrain's router adds no noise to its logits");
    // Hugging Face's defaults for what the file leaves out: the key/value heads are the heads, the
    // head untied.
    declared_.push_back({"model.arch", "\"llama\"", "config.json model_type"});
    declare_int(declared_, c, path, "num_hidden_layers", "model.n_layer");
    declare_int(declared_, c, path, "hidden_size", "model.d_model");
    declare_int(declared_, c, path, "num_attention_heads", "model.n_head");
    if (c.contains("num_key_value_heads")) declare_int(declared_, c, path, "num_key_value_heads", "model.n_kv_head");
    else declare_int(declared_, c, path, "num_attention_heads", "model.n_kv_head");
    declare_int(declared_, c, path, "intermediate_size", "model.ffn_hidden");
    if (mixtral_) {  // every block an MoE block, its experts as wide as intermediate_size, top-k renormalised
      declare_int(declared_, c, path, "num_local_experts", "model.moe.experts");
      declare_int(declared_, c, path, "num_experts_per_tok", "model.moe.top_k");
      declare_int(declared_, c, path, "intermediate_size", "model.moe.ffn_hidden");
      declared_.push_back({"model.moe.norm_topk", "true", "config.json model_type mixtral (renormalised top-k)"});
    }
    if (qwen_moe_) declare_qwen_moe(c, path);
    if (olmoe_) declare_olmoe(c, path);
    declare_int(declared_, c, path, "vocab_size", "model.vocab");
    declared_.push_back({"model.attention_bias", qwen2_ ? "true" : "false",
                         qwen2_ ? "config.json model_type qwen2 (q, k and v biases)" : "config.json attention_bias"});
    // Hugging Face's defaults where the file leaves them out: LlamaConfig's, MixtralConfig's, OlmoeConfig's.
    const double theta = mixtral_ ? 1e6 : 10000, eps = mixtral_ || olmoe_ ? 1e-5 : 1e-6;
    const bool theta_given = c.contains("rope_theta") && !c["rope_theta"].is_null();
    declared_.push_back({"model.rope_theta", toml_number(number("rope_theta", theta)),
                         theta_given ? "config.json rope_theta"
                                     : "config.json (no rope_theta: Hugging Face's " + toml_number(theta) + ")"});
    const bool eps_given = c.contains("rms_norm_eps") && !c["rms_norm_eps"].is_null();
    declared_.push_back({"model.norm_eps", toml_number(number("rms_norm_eps", eps)),
                         eps_given ? "config.json rms_norm_eps"
                                   : "config.json (no rms_norm_eps: Hugging Face's " + toml_number(eps) + ")"});
    if (c.contains("tie_word_embeddings") && !c["tie_word_embeddings"].is_boolean())
      refuse("tie_word_embeddings", "not true or false");
    tied_ = c.value("tie_word_embeddings", false);
    declared_.push_back({"model.tie_embeddings", tied_ ? "true" : "false", "config.json tie_word_embeddings"});
  }

  // A Qwen2-MoE: every decoder_sparse_step-th block an MoE block (the others dense, intermediate_size
  // wide), its experts moe_intermediate_size wide, one shared expert with its gate, top-k as
  // norm_topk_prob says (Qwen2MoeConfig's default: not renormalised).
  void declare_qwen_moe(const json& c, const std::string& path) {
    if (c.contains("mlp_only_layers") && !(c["mlp_only_layers"].is_array() && c["mlp_only_layers"].empty()))
      throw SpecError(
          path + ": mlp_only_layers = " + c["mlp_only_layers"].dump() +
          ": pipetrain's MoE blocks are every model.moe.every-th (decoder_sparse_step), with no others dense");
    declare_experts(c, path, "moe_intermediate_size");
    declare_int(declared_, c, path, "decoder_sparse_step", "model.moe.every");
    declared_.push_back({"model.moe.shared_experts", "1", "config.json model_type qwen2_moe (one shared expert)"});
    declare_int(declared_, c, path, "shared_expert_intermediate_size", "model.moe.shared_ffn_hidden");
    declared_.push_back({"model.moe.shared_gate", "true", "config.json model_type qwen2_moe (shared_expert_gate)"});
  }

  // Qwen2-MoE's and OLMoE's experts: num_experts of `ffn_key`'s width, num_experts_per_tok a token,
  // norm_topk_prob (their default: false, the chosen probabilities as they are).
  void declare_experts(const json& c, const std::string& path, const char* ffn_key) {
    declare_int(declared_, c, path, "num_experts", "model.moe.experts");
    declare_int(declared_, c, path, "num_experts_per_tok", "model.moe.top_k");
    declare_int(declared_, c, path, ffn_key, "model.moe.ffn_hidden");
    const bool norm = c.value("norm_topk_prob", false);
    declared_.push_back({"model.moe.norm_topk", norm ? "true" : "false",
                         c.contains("norm_topk_prob") ? "config.json norm_topk_prob"
                                                      : "config.json (no norm_topk_prob: Hugging Face's false)"});
  }

  // An OLMoE: q and k normalised, every block an MoE block of experts intermediate_size wide, top-k
  // as norm_topk_prob says (OlmoeConfig's default: not renormalised); a clip of q, k and v refused.
  void declare_olmoe(const json& c, const std::string& path) {
    if (c.contains("clip_qkv") && !c["clip_qkv"].is_null())
      throw SpecError(path + ": clip_qkv = " + c["clip_qkv"].dump() + ": pipetrain does not clip q, k and v");
    declared_.push_back({"model.qk_norm", "true", "config.json model_type olmoe (q_norm, k_norm)"});
    declare_experts(c, path, "intermediate_size");
  }

  struct Held {
    const SafetensorsEntry* entry;
    const SafetensorsFile* file;
    int64_t first_row;  // in pipetrain's tensor (a Mixtral expert's part of the stacked experts)
  };
  bool mixtral_, qwen_moe_, olmoe_, qwen2_;  // qwen2_: Qwen2's block (q, k and v biases), a Qwen2-MoE's too
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::vector<Held>> by_name_;
  bool tied_ = false;
  std::vector<DeclaredKey> declared_;
};

class LlmcSource : public WeightsSource {
 public:
  explicit LlmcSource(const std::string& path) : WeightsSource(path), file_(path) {}
  std::string kind() const override { return std::string("llm.c model file, ") + dtype_name(file_.header().dtype); }
  std::vector<DeclaredKey> declared() const override {
    const LlmcHeader& h = file_.header();
    return {{"model.arch", "\"gpt2\"", "llm.c model file (GPT-2)"},
            {"model.n_layer", std::to_string(h.n_layer), "llm.c header num_layers"},
            {"model.d_model", std::to_string(h.channels), "llm.c header channels"},
            {"model.n_head", std::to_string(h.n_head), "llm.c header num_heads"},
            {"model.vocab", std::to_string(h.vocab), "llm.c header vocab_size"},
            {"model.tie_embeddings", "true", "llm.c model file (its head is tied)"}};
  }
  std::optional<std::vector<int64_t>> shape(const std::string& name) const override { return file_.shape(name); }
  void read(const std::string& name, float* out) const override { file_.read(name, out); }

 private:
  LlmcFile file_;
};

// A checkpoint's parameters (not its AdamW moments), read from the shard that holds each.
class CheckpointSource : public WeightsSource {
 public:
  explicit CheckpointSource(const std::string& dir) : WeightsSource(dir), manifest_(Manifest::read(dir)) {
    for (const Manifest::Shard& s : manifest_.shards) {
      auto& reader = readers_[s.file];
      try {
        reader = std::make_unique<ShardReader>(dir + "/" + s.file);
      } catch (const std::runtime_error& e) {
        throw SpecError(e.what());
      }
      for (const TensorInfo& t : reader->tensors()) tensors_[t.name] = {t.shape, reader.get()};
    }
  }
  std::string kind() const override { return "pipetrain checkpoint, step " + std::to_string(manifest_.step); }
  // The model keys as the checkpoint's spec has them (a key it predates: its default); the llama
  // family's own keys only for a llama.
  std::vector<DeclaredKey> declared() const override {
    std::vector<DeclaredKey> out;
    const bool llama = manifest_.spec_value("model.arch") == "\"llama\"";
    for (const char* key :
         {"model.arch", "model.n_layer", "model.d_model", "model.n_head", "model.vocab", "model.tie_embeddings",
          "model.n_kv_head", "model.ffn_hidden", "model.rope_theta", "model.norm_eps", "model.attention_bias",
          "model.moe.experts", "model.moe.top_k", "model.moe.ffn_hidden", "model.moe.shared_experts",
          "model.moe.norm_topk", "model.moe.every", "model.moe.capacity_factor"}) {
      if (!llama && out.size() == 6) break;
      out.push_back({key, manifest_.spec_value(key), "manifest " + std::string(key)});
    }
    return out;
  }
  std::optional<std::vector<int64_t>> shape(const std::string& name) const override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return std::nullopt;
    return it->second.shape;
  }
  void read(const std::string& name, float* out) const override {
    const Held& t = tensors_.at(name);
    try {
      t.reader->read("params", name, std::vector<int>(t.shape.begin(), t.shape.end()), out);
    } catch (const std::runtime_error& e) {
      throw SpecError(e.what());
    }
  }
  std::string verify(int part, int parts) const override { return verify_checkpoint(path(), part, parts); }

 private:
  struct Held {
    std::vector<int64_t> shape;
    ShardReader* reader;
  };
  Manifest manifest_;
  std::map<std::string, std::unique_ptr<ShardReader>> readers_;
  std::map<std::string, Held> tensors_;
};

}  // namespace

std::unique_ptr<WeightsSource> open_hf_gpt2(const std::string& dir, const json& config,
                                            const std::string& config_path) {
  const fs::path weights = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  if (!fs::exists(weights, ec)) return nullptr;  // not a model: WeightsSource::open says what is missing
  return std::make_unique<HfSource>(dir, weights.string(), true, &config, config_path);
}

std::unique_ptr<WeightsSource> open_hf_llama(const std::string& dir, const json& config,
                                             const std::string& config_path) {
  return std::make_unique<HfLlamaSource>(dir, config, config_path);
}

std::unique_ptr<WeightsSource> WeightsSource::open(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "manifest.json", ec)) return std::make_unique<CheckpointSource>(path);
    const std::string config_path = (p / "config.json").string();
    const bool weights = fs::exists(p / "model.safetensors", ec) || fs::exists(p / "model.safetensors.index.json", ec);
    // A Hugging Face directory says what model it holds in config.json: without it nothing is guessed.
    if (weights && !fs::exists(config_path, ec))
      throw SpecError(path +
                      ": a Hugging Face model directory without config.json (which says the model's family "
                      "and shape): copy it from where the weights came from");
    if (fs::exists(config_path, ec)) {
      const json config = read_hf_config(config_path);
      const json type = config.contains("model_type") ? config["model_type"] : json("gpt2");
      const HfFamily* family = type.is_string() ? hf_family_of_type(type.get<std::string>()) : nullptr;
      if (!family)
        throw SpecError(config_path + ": model_type = " + type.dump() + ": pipetrain reads Hugging Face " +
                        hf_family_types() + " models");
      if (auto source = family->open(path, config, config_path)) return source;
    }
    throw SpecError(path +
                    ": not a model: a folder without manifest.json (a pipetrain checkpoint, "
                    "RUN_DIR/checkpoints/step_N), model.safetensors (a Hugging Face model directory) "
                    "or config.json with model.safetensors.index.json (a sharded one)");
  }
  if (!fs::exists(p, ec)) throw SpecError(path + ": no such file or directory");
  if (LlmcFile::looks_like(path)) return std::make_unique<LlmcSource>(path);
  if (SafetensorsFile::looks_like(path)) return std::make_unique<HfSource>(path, path, false, nullptr, "");
  throw SpecError(path + ": not a model: neither an llm.c model file (magic " + std::to_string(kLlmcMagic) +
                  ") nor a safetensors file");
}

}  // namespace pipetrain
