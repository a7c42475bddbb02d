// libFuzzer target: the safetensors reader, the first thing train.init_from does with a
// downloaded model file. Any input must end in a parsed file whose every tensor reads (or is
// refused with a SpecError for its dtype), or in a SpecError naming the file: never a crash, an
// out-of-range read or another exception. The reader takes a path, so each input is written to a
// file first.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "pipetrain/interop/safetensors.hpp"
#include "pipetrain/util/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/pipetrain-fuzz-safetensors-" + std::to_string(::getpid());
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    const pipetrain::SafetensorsFile file(path);
    std::vector<float> values;
    for (const auto& e : file.entries()) {
      uint64_t count = 1;
      for (int64_t d : e.shape) count *= static_cast<uint64_t>(d);
      values.resize(count);
      try {
        file.read(e, values.data());
      } catch (const pipetrain::SpecError&) {  // a dtype that is not a float
      }
    }
  } catch (const pipetrain::SpecError&) {
  }
  return 0;
}
