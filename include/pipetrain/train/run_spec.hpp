// The run spec as train, plan and `train --print-spec` read it: the file and overrides, with the
// keys they leave unset taken from where they already are, and printed as resolved.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"

namespace pipetrain {

// The keys a spec (read unchecked) leaves to its sources: from a train.init_from model every key
// it declares (family, shape, constants: its config.json, llm.c header or checkpoint manifest),
// unless the spec names another family, which the import then refuses by name; model.vocab from
// the token file's vocab_size (data.source = "hdf5") where the model does not give it. A source
// that cannot be read implies nothing and `unread` says why (a resumed run does not read it; a
// fresh start refuses it when it opens it); so does an unreadable token file (opening the data
// says what is wrong).
std::vector<ImpliedKey> implied_keys(const RunSpec& unchecked, std::string* unread);

// load_spec with the implied keys of the spec's own sources.
RunSpec load_run_spec(const std::string& path, const std::vector<std::string>& overrides, int world_size,
                      const std::string& ranks_are = kLaunchedRanks);

}  // namespace pipetrain
