// A model's weights in one of the forms pipetrain reads: a Hugging Face GPT-2 directory
// (model.safetensors, config.json) or a bare .safetensors file, a Hugging Face Llama directory
// (config.json with model_type llama; model.safetensors, or shards listed by
// model.safetensors.index.json), an llm.c model file, or a pipetrain checkpoint directory. Whatever the form, tensors
// are looked up by pipetrain's names and come out in pipetrain's layout ([out, in]; Conv1D matrices transposed, llm.c's
// padding rows dropped), so the code that uses them (train.init_from, export) knows no format.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"

namespace pipetrain {

// One thing a source says about its model, as a spec key: the value as TOML text and the source's
// own name for it ("config.json hidden_size", "llm.c header channels").
struct DeclaredKey {
  std::string key, value, theirs;
};

class WeightsSource {
 public:
  // Tells the form apart (a folder by manifest.json or model.safetensors, a file by its first
  // bytes) and reads its header; SpecError naming `path` when it holds no model.
  static std::unique_ptr<WeightsSource> open(const std::string& path);
  virtual ~WeightsSource() = default;

  const std::string& path() const { return path_; }
  // The form, for the start line: "Hugging Face GPT-2 directory, BF16".
  virtual std::string kind() const = 0;
  // What the source says its model is, family first (model.arch), then its shape and constants:
  // what train.init_from takes for the keys a spec leaves unset, and holds a spec's explicit keys
  // against. A Hugging Face config's key left out counts with Hugging Face's default.
  virtual std::vector<DeclaredKey> declared() const = 0;
  // Tensor `name` (pipetrain's name) as the source names it, for messages.
  virtual std::string own_name(const std::string& name) const { return name; }
  // Tensor `name`'s shape in pipetrain's layout, or nothing when the source does not hold it (a
  // tied model holds no lm_head.weight).
  virtual std::optional<std::vector<int64_t>> shape(const std::string& name) const = 0;
  // Reads tensor `name` (of shape(name)) into `out` in pipetrain's layout. SpecError naming the file.
  virtual void read(const std::string& name, float* out) const = 0;
  // Checks the stored bytes where the form records checksums (a checkpoint's shards with index %
  // parts == part); "" when fine, else what is wrong.
  virtual std::string verify(int /*part*/, int /*parts*/) const { return ""; }

 protected:
  explicit WeightsSource(std::string path) : path_(std::move(path)) {}

 private:
  std::string path_;
};

// A Hugging Face directory of each family, its config.json read (hf_family.hpp's table opens them);
// null from open_hf_gpt2 when the directory holds no model.safetensors.
std::unique_ptr<WeightsSource> open_hf_gpt2(const std::string& dir, const nlohmann::json& config,
                                            const std::string& config_path);
std::unique_ptr<WeightsSource> open_hf_llama(const std::string& dir, const nlohmann::json& config,
                                             const std::string& config_path);

}  // namespace pipetrain
