#include "pipetrain/interop/weights_source.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "pipetrain/ckpt/manifest.hpp"
#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/interop/gpt2_layout.hpp"
#include "pipetrain/interop/llmc_model.hpp"
#include "pipetrain/interop/safetensors.hpp"
#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain {
namespace {

// model.safetensors (GPT2LMHeadModel's names, or GPT2Model's without "transformer."), with the
// config.json beside it when there is one: what it declares must be the block pipetrain computes.
class HfSource : public WeightsSource {
 public:
  HfSource(const std::string& path, const std::string& file, const std::string& config)
      : WeightsSource(path), st_(file), directory_(!config.empty()) {
    for (const SafetensorsEntry& e : st_.entries()) {
      const std::string name = name_from_hf(e.name);
      if (!name.empty() && !by_name_.count(name)) by_name_[name] = &e;
    }
    if (by_name_.empty()) throw SpecError(file + ": holds no GPT-2 tensors (transformer.wte.weight, ...)");
    if (!config.empty() && fs::exists(config)) check_config(config);
  }

  std::string kind() const override {
    const auto wte = by_name_.find("wte.weight");
    return std::string(directory_ ? "Hugging Face GPT-2 directory" : "safetensors file") +
           (wte == by_name_.end() ? "" : ", " + wte->second->dtype);
  }
  int n_head() const override { return n_head_; }

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
  void check_config(const std::string& config) {
    json c;
    try {
      c = json::parse(read_input_file(config, "Hugging Face config", 1 << 20));
    } catch (const json::exception& e) {
      throw SpecError(config + ": not valid JSON (" + e.what() + ")");
    }
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

class LlmcSource : public WeightsSource {
 public:
  explicit LlmcSource(const std::string& path) : WeightsSource(path), file_(path) {}
  std::string kind() const override { return std::string("llm.c model file, ") + dtype_name(file_.header().dtype); }
  int n_head() const override { return file_.header().n_head; }
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
  int n_head() const override {
    auto it = manifest_.spec.find("model.n_head");
    return it == manifest_.spec.end() ? 0 : std::atoi(it->second.c_str());
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
    if (fs::exists(p / "model.safetensors", ec))
      return std::make_unique<HfSource>(path, (p / "model.safetensors").string(), (p / "config.json").string());
    throw SpecError(path +
                    ": not a model: a folder without manifest.json (a pipetrain checkpoint, "
                    "RUN_DIR/checkpoints/step_N) or model.safetensors (a Hugging Face GPT-2 directory)");
  }
  if (!fs::exists(p, ec)) throw SpecError(path + ": no such file or directory");
  if (LlmcFile::looks_like(path)) return std::make_unique<LlmcSource>(path);
  if (SafetensorsFile::looks_like(path)) return std::make_unique<HfSource>(path, path, "");
  throw SpecError(path + ": not a model: neither an llm.c model file (magic " + std::to_string(kLlmcMagic) +
                  ") nor a safetensors file");
}

}  // namespace pipetrain
