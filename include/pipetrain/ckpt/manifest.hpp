// The checkpoint layout: RUN_DIR/checkpoints/step_NNNNNNNN/{manifest.json, stage_SSS.h5, ...} plus
// RUN_DIR/checkpoints/latest naming the newest complete one; the manifest, read and written; and
// the check of a checkpoint directory against its manifest. Tensors are keyed by global names, so
// any pp x dp layout of the same model can load them. No MPI here.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/config/spec.hpp"

namespace pipetrain {

constexpr const char* kTokenizerFile = "tokenizer.model";

struct Manifest {
  int format = 0;
  int64_t step = 0;
  std::string spec_hash;
  std::map<std::string, std::string> spec;  // every spec key -> its value as TOML text
  // The value of spec key `dotted` the checkpoint was saved with, as TOML text. A key added after
  // it was written (model.arch and the llama keys) holds what is now the key's default.
  std::string spec_value(const std::string& dotted) const;
  int pp = 0, dp = 0;
  int virtual_stages = 1;        // chunks per stage (interleaved schedule); shard s holds all of stage s's
  std::vector<int> partition;    // blocks per virtual stage (pp x virtual_stages entries)
  int64_t samples_consumed = 0;  // data position: global samples step*global_batch done
  // A mixture's: the training tokens drawn from each source up to the data position.
  std::vector<std::pair<std::string, int64_t>> tokens_by_source;
  int64_t optimizer_steps = 0;  // AdamW updates applied: step minus the steps skipped as non-finite
  struct Shard {
    std::string file;
    uint64_t bytes = 0, checksum = 0;
    std::vector<std::string> tensors;
  };
  std::vector<Shard> shards;
  // The run's SentencePiece model (kTokenizerFile), kept with the weights so generate and export
  // need nothing else; file empty when the run has none (byte tokens or imported ids).
  struct Tokenizer {
    std::string file;
    uint64_t bytes = 0, checksum = 0;
  } tokenizer;
  double write_s = 0;
  std::string build;  // version_string() of the pipetrain that saved it ("" in older checkpoints)

  std::string to_json() const;
  // Reads DIR/manifest.json; throws SpecError naming the file on anything malformed.
  static Manifest read(const std::string& dir);
  // Throws SpecError naming `path` unless the text is a manifest whose fields loading can rely on
  // (format, non-negative positions, a layout consistent with its shard list, plain file names).
  static Manifest parse(const std::string& text, const std::string& path);
};

// Names in the layout: the directory of checkpoint `step` (step_00000100), the shard of `stage`
// (stage_000.h5); a checksum or the spec hash as the manifest and messages write it (16 hex digits).
std::string checkpoint_name(int64_t step);
std::string shard_file_name(int stage);
std::string hex16(uint64_t value);

// The step_N checkpoint directories of a checkpoints folder, newest first: (step, path).
std::vector<std::pair<int64_t, std::string>> checkpoints_in(const std::string& folder);

// Checks DIR against its manifest: the manifest against its directory name and the model its spec
// describes, and every shard (those with index % parts == part) present, of the recorded size and
// checksum, holding the listed tensors at their shapes. Returns "" when fine, else what is wrong
// (naming the file).
std::string verify_checkpoint(const std::string& dir, int part = 0, int parts = 1);

// The spec a checkpoint was saved with (its manifest), as `pipetrain eval` starts from without
// --config: laid out as pp 1 x dp world_size, uniform partition, gpipe, unless `overrides` (applied
// after) say otherwise. SpecError naming the manifest or the key.
RunSpec spec_of_checkpoint(const std::string& dir, const std::vector<std::string>& overrides, int world_size);

}  // namespace pipetrain
