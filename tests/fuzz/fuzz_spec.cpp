// libFuzzer target: the run-spec parser and validator. Any input must end in a parsed spec or a
// SpecError (bad input, exit 2), never a crash, hang or other exception. A spec that parses must
// survive the round trip through the resolved config.toml every run writes: parsing that text
// gives the same spec (same hash), which is what resuming from a run dir relies on.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "pipetrain/config/spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  pipetrain::RunSpec spec;
  try {
    spec = pipetrain::parse_spec(text, "fuzz.toml", {}, 0);
  } catch (const pipetrain::SpecError&) {
    return 0;  // rejected with a message: the expected outcome for most inputs
  }
  const std::string resolved = pipetrain::resolved_toml(spec);
  try {
    const pipetrain::RunSpec again = pipetrain::parse_spec(resolved, "config.toml", {}, 0);
    if (pipetrain::spec_hash(again) != pipetrain::spec_hash(spec)) std::abort();  // round trip changed the spec
  } catch (const pipetrain::SpecError&) {
    std::abort();  // the resolved config of a valid spec must itself be valid
  }
  return 0;
}
