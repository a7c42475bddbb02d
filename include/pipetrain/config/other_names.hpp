// The names other trainers give pipetrain's settings, for the did-you-mean of an unknown key: a
// user arriving from Hugging Face (config.json, TrainingArguments), Megatron-LM, torchtitan,
// DeepSpeed or nanoGPT/llm.c types what they know.
#pragma once
#include <string>

namespace pipetrain {

struct OtherName {
  const char* name;  // as the other trainer spells it (the key's last part)
  const char* ours;  // the spec key of the same meaning; "" when pipetrain has none (`note` says why)
  const char* note;  // how it differs, "" when it does not ("the opposite: ...")
};

// The spec key that `key_name` means in another trainer, or nullptr when it is none of theirs.
const OtherName* other_trainers_name(const std::string& key_name);

}  // namespace pipetrain
