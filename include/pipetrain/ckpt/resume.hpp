// Which checkpoint a start takes its state from, whether it may (the spec keys that must agree),
// and loading it into any layout: tensors are read by global name, each rank its own.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/ckpt/manifest.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/dist/world.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optim.hpp"
#include "pipetrain/model/optimizer_shard.hpp"

namespace pipetrain {

// `train --resume`: the newest intact checkpoint of the run directory (automatic), none (never),
// or the one a path names.
enum class ResumeMode { automatic, never, path };

struct ResumeFrom {
  ResumeMode mode = ResumeMode::automatic;
  std::string path;         // ResumeMode::path: a checkpoint, or a run directory, its checkpoints folder or latest file
  bool model_only = false;  // evaluation: only the model is loaded, so the data and batch may differ

  ResumeFrom() = default;
  ResumeFrom(ResumeMode m, std::string p = {}) : mode(m), path(std::move(p)) {}
  // The command line's spelling: "auto", "never", anything else a path. The one place the text is
  // read; below the command line only the mode is compared.
  static ResumeFrom parse(const std::string& text);
};

// The checkpoints a path names, newest first: PATH itself when it is one (a folder holding
// manifest.json); for a run directory, its checkpoints folder, or that folder's `latest` file,
// every step_N checkpoint of that folder. Empty when PATH is none of these.
std::vector<std::string> checkpoints_named_by(const std::string& path);

// For the commands that read one checkpoint (eval, generate, export, ckpt): the checkpoint PATH
// names, verified (checksums, the manifest against the shards). Where PATH names a folder of
// them, the newest intact one, saying on stderr which it took and which it skipped as damaged.
// SpecError naming PATH and what is wrong when there is none.
std::string resolve_checkpoint(const std::string& path, const std::string& command);

// The spec keys a checkpoint must agree on to be loaded (model shape; to train on, also the data
// stream and batch). Returns "" or a message naming the first key that differs.
std::string incompatibility(const Manifest& m, const RunSpec& spec, bool model_only = false);

// Keys that may change on resume but change the run (LR schedule, optimizer): "key old -> new".
std::vector<std::string> changed_training_keys(const Manifest& m, const RunSpec& spec);

// Collective over `world`: the verified checkpoint to resume from, or "" for a fresh start;
// `checkpoints` is the run's own folder of them (RUN_DIR/checkpoints). Automatically, a corrupt
// newest checkpoint falls back to the one before (and says so); none usable at all is an
// AgreedExit (bad_input; rank 0 said why), as is a bad path or a checkpoint of another model.
std::string select_checkpoint(const ResumeFrom& resume, const std::string& checkpoints, const RunSpec& spec,
                              World& world);

// Reads `params` by name from a checkpoint's shards into a flat buffer at their offsets, and with
// a `shard` the AdamW moments of its slabs into exp_avg / exp_avg_sq at their state offsets (null:
// the moments are skipped). Any process, no MPI. SpecError naming a missing tensor or a shard that
// does not fit.
void read_checkpoint_tensors(const std::string& dir, const std::vector<ParamTensor>& params, float* weights,
                             const OptimizerShard* shard, float* exp_avg, float* exp_avg_sq);

// Collective: loads this rank's tensors and optimizer state from a selected checkpoint (agreed:
// AgreedExit on every rank if one fails); returns its step.
int64_t load_checkpoint(const std::string& dir, Stage& stage, AdamW& opt, World& world);

}  // namespace pipetrain
