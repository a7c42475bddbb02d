// The one table of run-spec keys: type, range, default (taken from RunSpec's initialisers), doc.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "pipetrain/config/spec.hpp"

namespace pipetrain {

struct SpecKey {
  std::string section, key, doc;
  // Reads the node into the spec; `where` is "file:line" or "--set ..." for error messages.
  std::function<void(RunSpec&, const toml::node&, const std::string& where)> set;
  // The current value as TOML text.
  std::function<std::string(const RunSpec&)> show;
  bool takes_string = false;  // --set keeps the raw text for these (run.name=2024 is a name)
  std::string dotted() const { return section + "." + key; }
};

const std::vector<SpecKey>& spec_schema();
// The key named "section.key", or null where the schema has none.
const SpecKey* find_spec_key(const std::string& dotted);

// Closest candidate within a small edit distance (a third of the word's length, at least 2, unless
// `max_distance` says), or "" (for did-you-mean hints).
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates, size_t max_distance = 0);

}  // namespace pipetrain
