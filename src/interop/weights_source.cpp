#include "pipetrain/interop/weights_source.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipetrain/ckpt/manifest.hpp"
#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/config/spec_schema.hpp"
#include "pipetrain/interop/gpt2_layout.hpp"
#include "pipetrain/interop/llama_layout.hpp"
#include "pipetrain/interop/llmc_model.hpp"
#include "pipetrain/interop/safetensors.hpp"
#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain {
namespace {

// The source's attention heads against the spec's (0: the source cannot say).
std::string heads_mismatch(int heads, const RunSpec& spec) {
  if (heads <= 0 || heads == spec.model.n_head) return "";
  return "the source has " + std::to_string(heads) +
         " attention heads, model.n_head = " + std::to_string(spec.model.n_head);
}

// A GPT-2 form (Hugging Face GPT-2, llm.c) read for a spec of another family.
std::string gpt2_mismatch(const char* form, int heads, const RunSpec& spec) {
  if (spec.model.arch != Arch::gpt2)
    return std::string("the source is ") + form + ", model.arch = \"" + name_of(spec.model.arch) + "\"";
  return heads_mismatch(heads, spec);
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
    if (config) check_config(*config, config_path);
  }

  std::string kind() const override {
    const auto wte = by_name_.find("wte.weight");
    return std::string(directory_ ? "Hugging Face GPT-2 directory" : "safetensors file") +
           (wte == by_name_.end() ? "" : ", " + wte->second->dtype);
  }
  std::string mismatch(const RunSpec& spec) const override {
    return gpt2_mismatch("a Hugging Face GPT-2 model", n_head_, spec);
  }

  std::optional<std::vector<int64_t>> shape(const std::string& name) const override {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return std::nullopt;
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
  // approximation, LayerNorm eps 1e-5. The heads are checked against the spec by the caller.
  void check_config(const json& c, const std::string& config) {
    auto refuse = [&](const std::string& key, const std::string& why) {
      throw SpecError(config + ": " + key + " = " + c[key].dump() + ": " + why);
    };
    if (c.contains("model_type") && c["model_type"] != "gpt2") refuse("model_type", "not a GPT-2 model");
    if (c.contains("activation_function") && c["activation_function"] != "gelu_new" &&
        c["activation_function"] != "gelu_pytorch_tanh")
      refuse("activation_function", "pipetrain's blocks use gelu_new (GELU, tanh approximation)");
    if (c.contains("layer_norm_epsilon") &&
        (!c["layer_norm_epsilon"].is_number() || std::abs(c["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12))
      refuse("layer_norm_epsilon", "pipetrain's LayerNorm uses 1e-5");
    if (c.contains("n_head")) {
      if (!c["n_head"].is_number_integer()) refuse("n_head", "not an integer");
      n_head_ = c["n_head"].get<int>();
    }
  }

  SafetensorsFile st_;
  bool directory_;
  int n_head_ = 0;
  std::map<std::string, const SafetensorsEntry*> by_name_;
};

// A Hugging Face LlamaForCausalLM directory: config.json (model_type llama) and model.safetensors,
// or the shards model.safetensors.index.json maps each tensor to. Tensors are F32, BF16 or F16 in
// pipetrain's layout already; the config must describe the block pipetrain computes.
class HfLlamaSource : public WeightsSource {
 public:
  HfLlamaSource(const std::string& dir, const json& config, const std::string& config_path) : WeightsSource(dir) {
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
      const std::string name = name_from_hf_llama(hf);
      if (name.empty()) continue;
      if (file.find('/') != std::string::npos || file.empty())
        throw SpecError(index + ": " + hf + " is in \"" + file + "\": shards must lie beside the index");
      auto& shard = files_[file];
      if (!shard) {
        if (!fs::exists(dir + "/" + file)) throw SpecError(index + ": lists " + file + ", which is not in " + dir);
        shard = std::make_unique<SafetensorsFile>(dir + "/" + file);
      }
      const SafetensorsEntry* e = shard->find(hf);
      if (!e) throw SpecError(index + ": maps " + hf + " to " + file + ", which does not hold it");
      by_name_[name] = {e, shard.get()};
    }
    if (by_name_.empty()) throw SpecError(dir + ": holds no Llama tensors (model.embed_tokens.weight, ...)");
  }

  std::string kind() const override {
    const auto wte = by_name_.find("wte.weight");
    return "Hugging Face Llama directory" + std::string(files_.size() > 1 ? ", sharded" : "") +
           (wte == by_name_.end() ? "" : ", " + wte->second.entry->dtype);
  }

  std::string mismatch(const RunSpec& spec) const override {
    const auto& m = spec.model;
    if (m.arch != Arch::llama)
      return "the source is a Hugging Face Llama model, model.arch = \"" + std::string(name_of(m.arch)) + "\"";
    if (std::string heads = heads_mismatch(n_head_, spec); !heads.empty()) return heads;
    const struct {
      const char *theirs, *ours;
      double source, spec;
    } declared[] = {
        {"num_key_value_heads", "model.n_kv_head", static_cast<double>(n_kv_head_), static_cast<double>(m.n_kv_head)},
        {"rope_theta", "model.rope_theta", rope_theta_, m.rope_theta},
        {"rms_norm_eps", "model.norm_eps", rms_norm_eps_, m.norm_eps}};
    for (const auto& d : declared)
      if (std::abs(d.source - d.spec) > 1e-9 * std::abs(d.spec))
        return (std::ostringstream() << "the source's config.json has " << d.theirs << " = " << d.source << ", "
                                     << d.ours << " = " << d.spec)
            .str();
    return "";
  }

  std::optional<std::vector<int64_t>> shape(const std::string& name) const override {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) return std::nullopt;
    return it->second.entry->shape;
  }
  void read(const std::string& name, float* out) const override {
    const Held& h = by_name_.at(name);
    h.file->read(*h.entry, out);
  }

 private:
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
    for (const char* bias : {"attention_bias", "mlp_bias"})
      if (c.contains(bias) && c[bias] != false) refuse(bias, "pipetrain's llama block has no biases");
    n_head_ = static_cast<int>(number("num_attention_heads", 0));
    n_kv_head_ = static_cast<int>(number("num_key_value_heads", n_head_));  // absent: multi-head
    rope_theta_ = number("rope_theta", 10000);
    rms_norm_eps_ = number("rms_norm_eps", 1e-6);  // LlamaConfig's default
  }

  struct Held {
    const SafetensorsEntry* entry;
    const SafetensorsFile* file;
  };
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Held> by_name_;
  int n_head_ = 0, n_kv_head_ = 0;
  double rope_theta_ = 10000, rms_norm_eps_ = 1e-6;
};

class LlmcSource : public WeightsSource {
 public:
  explicit LlmcSource(const std::string& path) : WeightsSource(path), file_(path) {}
  std::string kind() const override { return std::string("llm.c model file, ") + dtype_name(file_.header().dtype); }
  std::string mismatch(const RunSpec& spec) const override {
    return gpt2_mismatch("an llm.c (GPT-2) model file", file_.header().n_head, spec);
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
  // The model keys that shapes cannot tell apart, as the checkpoint's spec has them (a key it
  // predates: its default).
  std::string mismatch(const RunSpec& spec) const override {
    for (const SpecKey& k : spec_schema()) {
      const std::string key = k.dotted();
      if (key != "model.arch" && key != "model.n_head" && key != "model.n_kv_head" && key != "model.rope_theta" &&
          key != "model.norm_eps")
        continue;
      const std::string saved = manifest_.spec_value(key);
      if (saved != k.show(spec)) return "the checkpoint has " + key + " = " + saved + ", this spec " + k.show(spec);
    }
    return "";
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

std::unique_ptr<WeightsSource> WeightsSource::open(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "manifest.json", ec)) return std::make_unique<CheckpointSource>(path);
    const std::string config_path = (p / "config.json").string();
    std::optional<json> config;
    if (fs::exists(config_path, ec)) config = read_hf_config(config_path);
    if (config && config->value("model_type", "") == "llama")
      return std::make_unique<HfLlamaSource>(path, *config, config_path);
    if (fs::exists(p / "model.safetensors", ec))
      return std::make_unique<HfSource>(path, (p / "model.safetensors").string(), true, config ? &*config : nullptr,
                                        config_path);
    throw SpecError(path +
                    ": not a model: a folder without manifest.json (a pipetrain checkpoint, "
                    "RUN_DIR/checkpoints/step_N), model.safetensors (a Hugging Face GPT-2 or Llama directory) "
                    "or config.json of model_type llama (a sharded Llama)");
  }
  if (!fs::exists(p, ec)) throw SpecError(path + ": no such file or directory");
  if (LlmcFile::looks_like(path)) return std::make_unique<LlmcSource>(path);
  if (SafetensorsFile::looks_like(path)) return std::make_unique<HfSource>(path, path, false, nullptr, "");
  throw SpecError(path + ": not a model: neither an llm.c model file (magic " + std::to_string(kLlmcMagic) +
                  ") nor a safetensors file");
}

}  // namespace pipetrain
