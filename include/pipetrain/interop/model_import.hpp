// train.init_from: a new run starts from the weights of another model (a Hugging Face GPT-2, an
// llm.c model file or a pipetrain checkpoint of any layout). Which source tensor feeds each of the
// spec's parameters is decided, and every shape checked, for the whole model before anything large
// is allocated; each rank then reads only its own stage's tensors.
//
// Rules: shapes must equal the spec's, except that a position table longer than model.seq_len
// gives its first seq_len rows (fine-tuning at a shorter context); a tied source into an untied
// spec gives lm_head.weight a copy of wte.weight; an untied source into a tied spec is refused
// (its head would be lost), as is one that declares another family, shape or constant than a key
// the spec sets. The keys the spec leaves unset are the source's (implied_keys, train layer).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/interop/weights_source.hpp"
#include "pipetrain/model/model.hpp"

namespace pipetrain {

class ModelImport {
 public:
  // Opens the source and matches the spec's model against it: what the source declares (its
  // family first), then every tensor's shape; SpecError naming train.init_from, the key or the
  // tensor as the source names it, and both values, on any mismatch.
  ModelImport(const std::string& path, const RunSpec& spec);
  // The source at `path` (SpecError naming train.init_from when it holds no model).
  static std::unique_ptr<WeightsSource> open_source(const std::string& path, const RunSpec& spec);

  // The source's own integrity check (a checkpoint's checksums), share `part` of `parts`.
  std::string verify(int part, int parts) const { return source_->verify(part, parts); }
  // One line for the start: what is loaded from where, and what the rules did.
  const std::string& description() const { return description_; }
  // Reads `params` (one rank's tensors) into `weights` at their offsets.
  void load(const std::vector<ParamTensor>& params, float* weights) const;

 private:
  // The source tensor that feeds parameter `name`.
  std::string source_of(const std::string& name) const;

  std::unique_ptr<WeightsSource> source_;
  bool head_from_wte_ = false;  // a tied source into an untied spec
  std::string description_;
};

}  // namespace pipetrain
