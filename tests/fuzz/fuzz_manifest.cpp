// libFuzzer target: the checkpoint manifest loader, the first thing resuming reads from disk. Any
// input must end in a Manifest or a SpecError naming the file, never a crash or other exception.
// A manifest that parses must round-trip: writing it and parsing that gives the same JSON.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "pipetrain/ckpt/manifest.hpp"
#include "pipetrain/config/spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  pipetrain::Manifest m;
  try {
    m = pipetrain::Manifest::parse(text, "manifest.json");
  } catch (const pipetrain::SpecError&) {
    return 0;
  }
  const std::string written = m.to_json();
  try {
    if (pipetrain::Manifest::parse(written, "manifest.json").to_json() != written) std::abort();
  } catch (const pipetrain::SpecError&) {
    std::abort();  // what we write must be what we read
  }
  return 0;
}
