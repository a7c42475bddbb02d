// Each model family as a Hugging Face model, in one table: its model_type, how each pipetrain
// tensor is named and laid out there (gpt2_layout.hpp, llama_layout.hpp), the config.json that
// describes what pipetrain computes, how a directory of it is opened, and whether llm.c's model
// file can hold it. Export and import read the table; no other code asks which family it has.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/data/tokenizer.hpp"
#include "pipetrain/interop/float_formats.hpp"
#include "pipetrain/interop/llama_layout.hpp"

namespace pipetrain {

class WeightsSource;

struct HfFamily {
  Arch arch;
  bool moe;                // holds a mixture of experts (model.moe)
  const char* model_type;  // config.json's
  const char* name;        // "GPT-2", "Llama": as Hugging Face names the model, for messages
  std::string (*hf_name)(const std::string& ours);
  bool (*transposed)(const std::string& ours);  // stored [in, out] (GPT-2's Conv1D)
  // The Hugging Face tensors pipetrain tensor `ours` of `shape` (pipetrain's layout) is stored as:
  // itself, or (a Mixtral's experts) rows of it each.
  std::vector<HfPart> (*parts)(const std::string& ours, const std::vector<int64_t>& shape, int experts);
  // Why this family cannot hold a model of `spec` ("" when it can): a key it has no place for.
  std::string (*cannot_hold)(const RunSpec& spec);
  nlohmann::json (*config)(const RunSpec& spec, StoredFloat dtype, const SpecialTokens& special);
  // A directory of this family, its config.json read; SpecError naming what does not fit.
  std::unique_ptr<WeightsSource> (*open)(const std::string& dir, const nlohmann::json& config,
                                         const std::string& config_path);
  bool llmc;  // llm.c's model file can hold it
};

const HfFamily& hf_family(Arch arch);
// The family a model of `spec` exports as: its arch's, a Mixtral for a mixture of experts (a
// Qwen2-MoE for one whose shared experts have a gate, an OLMoE for one with q and k norms), a Qwen2
// for a llama with q, k and v biases.
const HfFamily& hf_family(const RunSpec& spec);
// The family of a config.json's model_type; null when pipetrain has none (hf_family_types lists them).
const HfFamily* hf_family_of_type(const std::string& model_type);
std::string hf_family_types();  // GPT-2 ("gpt2"), Llama ("llama"), Mixtral ("mixtral"), ... and OLMoE ("olmoe")

}  // namespace pipetrain
