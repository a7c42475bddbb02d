// A model's weights in one of the forms pipetrain reads: a Hugging Face GPT-2 directory
// (model.safetensors, config.json) or a bare .safetensors file, a Hugging Face Llama directory
// (config.json with model_type llama; model.safetensors, or shards listed by
// model.safetensors.index.json), an llm.c model file, or a pipetrain checkpoint directory. Whatever the form, tensors
// are looked up by pipetrain's names and come out in pipetrain's layout ([out, in]; Conv1D matrices transposed, llm.c's
// padding rows dropped), so the code that uses them (train.init_from, export) knows no format.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"

namespace pipetrain {

class WeightsSource {
 public:
  // Tells the form apart (a folder by manifest.json or model.safetensors, a file by its first
  // bytes) and reads its header; SpecError naming `path` when it holds no model.
  static std::unique_ptr<WeightsSource> open(const std::string& path);
  virtual ~WeightsSource() = default;

  const std::string& path() const { return path_; }
  // The form, for the start line: "Hugging Face GPT-2 directory, BF16".
  virtual std::string kind() const = 0;
  // What the source declares about its model that its tensors' shapes cannot tell and the spec
  // disagrees with (the family, the heads, rotary and norm constants): "" when nothing, else one
  // phrase naming the spec key ("the source has 12 attention heads, model.n_head = 4").
  virtual std::string mismatch(const RunSpec& spec) const = 0;
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

}  // namespace pipetrain
