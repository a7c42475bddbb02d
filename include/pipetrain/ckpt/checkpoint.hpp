// Checkpoints: RUN_DIR/checkpoints/step_NNNNNNNN/{manifest.json, stage_SSS.h5, ...} plus
// RUN_DIR/checkpoints/latest naming the newest complete one.
//
// Atomic: shards and manifest are written into .tmp_step_NNNNNNNN, fsynced, and the directory is
// renamed into place; only then is `latest` replaced (write + fsync + rename). A step_* directory
// therefore always holds a complete checkpoint, and a crash at any moment leaves the previous one
// usable. Tensors are keyed by global names, so any pp x dp layout of the same model can load them.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/dist/comm.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optim.hpp"
#include "pipetrain/model/optimizer_shard.hpp"

namespace pipetrain {

constexpr const char* kTokenizerFile = "tokenizer.model";

struct Manifest {
  int format = 0;
  int64_t step = 0;
  std::string spec_hash;
  std::map<std::string, std::string> spec;  // every spec key -> its value as TOML text
  int pp = 0, dp = 0;
  int virtual_stages = 1;      // chunks per stage (interleaved schedule); shard s holds all of stage s's
  std::vector<int> partition;  // blocks per virtual stage (pp x virtual_stages entries)
  int64_t samples_consumed = 0;  // data position: global samples step*global_batch done
  int64_t optimizer_steps = 0;   // AdamW updates applied: step minus the steps skipped as non-finite
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
  static Manifest parse(const std::string& text, const std::string& path);
};

// Checks DIR against its manifest: every shard (those with index % parts == part) present, of the
// recorded size and checksum. Returns "" when fine, else what is wrong (naming the file).
std::string verify_checkpoint(const std::string& dir, int part = 0, int parts = 1);

// The checkpoints a path names, newest first: PATH itself when it is one (a folder holding
// manifest.json); for a run directory, its checkpoints folder, or that folder's `latest` file,
// every step_N checkpoint of that folder. Empty when PATH is none of these.
std::vector<std::string> checkpoints_named_by(const std::string& path);

// For the commands that read one checkpoint (eval, generate, export, ckpt): the checkpoint PATH
// names, verified (checksums, the manifest against the shards). Where PATH names a folder of
// them, the newest intact one, saying on stderr which it took and which it skipped as damaged.
// SpecError naming PATH and what is wrong when there is none.
std::string resolve_checkpoint(const std::string& path, const std::string& command);

// The spec keys a checkpoint must agree on to be loaded (model shape, data stream, batch).
// Returns "" or a message naming the first key that differs.
std::string incompatibility(const Manifest& m, const RunSpec& spec);

// The spec a checkpoint was saved with (its manifest), as `pipetrain eval` starts from without
// --config: laid out as pp 1 x dp world_size, uniform partition, gpipe, unless `overrides` (applied
// after) say otherwise. SpecError naming the manifest or the key.
RunSpec spec_of_checkpoint(const std::string& dir, const std::vector<std::string>& overrides, int world_size);

// Reads `params` by name from a checkpoint's shards into a flat buffer at their offsets, and with
// a `shard` the AdamW moments of its slabs into exp_avg / exp_avg_sq at their state offsets (null:
// the moments are skipped). Any process, no MPI. SpecError naming a missing tensor or a shard that
// does not fit.
void read_checkpoint_tensors(const std::string& dir, const std::vector<ParamTensor>& params, float* weights,
                             const OptimizerShard* shard, float* exp_avg, float* exp_avg_sq);

// Keys that may change on resume but change the run (LR schedule, optimizer): "key old -> new".
std::vector<std::string> changed_training_keys(const Manifest& m, const RunSpec& spec);

class Checkpointer {
 public:
  Checkpointer(const RunSpec& spec, const std::string& run_dir, Comm& comm);
  ~Checkpointer();
  std::string dir() const { return dir_; }
  // Rank 0: the SentencePiece model every checkpoint carries from now on ("" for none).
  void set_tokenizer(std::string model) { tokenizer_ = std::move(model); }

  // Collective over all ranks: writes checkpoint `step`. Returns the seconds it took. Throws
  // AgreedExit on every rank if any rank failed (the failing rank has said why); what it wrote
  // is removed and the previous checkpoints are untouched.
  double save(int64_t step, Stage& stage, const AdamW& opt, const std::vector<int>& partition);

  // checkpoint.async. start_save (collective) does what training must wait for: the shard files
  // are created with their structure (HDF5, on this thread) and this rank's slabs are copied into
  // a host snapshot; their bytes are then written and fsynced on a background thread while
  // training goes on. advance (collective, at step boundaries) moves saves on whenever every rank
  // has finished its part: once written the snapshot is free again and the shards are read back
  // and checksummed, then rank 0 writes the manifest and publishes, as save does; the next save
  // may be written meanwhile, and publishes after it. advance returns the saves that ended (a failure:
  // the failing rank has said why, and what the save wrote is removed); `until` says how long to
  // go on: one round, until a new save may start (no snapshot held), or until no save is in flight.
  // start_save throws AgreedExit like save.
  struct Outcome {
    int64_t step;
    bool saved;
    double seconds;  // from start_save to published (or to the failure)
  };
  enum class Until { one_round, room, all_ended };
  void start_save(int64_t step, Stage& stage, const AdamW& opt, const std::vector<int>& partition);
  std::vector<Outcome> advance(Until until);
  bool saving() const { return in_flight_[0] || in_flight_[1] || in_flight_[2]; }

  // Collective: the verified checkpoint to resume from for --resume auto | never | PATH, or ""
  // for a fresh start. With auto, a corrupt newest checkpoint falls back to the one before (and
  // says so); none usable at all is a SpecError, as is a bad PATH.
  std::string select(const std::string& resume);

  // Loads this rank's tensors and optimizer state from a selected checkpoint; returns its step.
  int64_t load(const std::string& dir, Stage& stage, AdamW& opt);

  // Rank 0, after resuming at `step`: checkpoints of this run newer than it belong to a future
  // that will now be recomputed; they are renamed step_N.discardedK (kept, never loaded again).
  void discard_newer_than(int64_t step);

 private:
  double write(int64_t step, Stage& stage, const AdamW& opt, const std::vector<int>& partition, const std::string& tmp);
  void prepare(const std::string& tmp);  // rank 0, agreed: leftovers removed, tmp created
  void discard(const std::string& tmp);  // rank 0: a failed save's files
  std::vector<ShardTensor> slab_tensors(const Stage& stage, const AdamW& opt, const float* w, const float* m,
                                        const float* v, std::vector<size_t>& floats) const;
  void check_shard(const std::string& shard, const std::vector<std::string>& names) const;
  // The manifest of checkpoint `step`; sums: world x {stage, checksum, bytes} gathered to rank 0.
  Manifest manifest(int64_t step, int64_t optimizer_steps, const std::vector<int>& partition,
                    const std::vector<uint64_t>& sums) const;
  void complete(Manifest m, const std::string& tmp, double t0);  // rank 0: tokenizer, manifest, publish
  void publish(const std::string& tmp, const std::string& final_dir, const std::string& name);
  void set_aside(const std::string& path);
  const RunSpec& spec_;
  std::string dir_;
  Comm& comm_;
  std::string tokenizer_;
  // Asynchronous saves in flight, at most one per stage of the way: its snapshot being written,
  // its shards being read back and checksummed, rank 0 writing its manifest and renaming it into
  // place. Each moves on when the next stage is free, so they publish in step order.
  struct PendingSave;
  static constexpr int kWriting = 0, kChecksumming = 1, kPublishing = 2, kStages = 3;
  std::unique_ptr<PendingSave> in_flight_[kStages];
  bool in_flight(const std::string& tmp) const;  // a save in flight writes to this temporary directory
  std::vector<float> spare_snapshot_;  // the snapshot buffer between saves, kept for the next
};

// `pipetrain ckpt inspect|verify PATH` (no MPI): exit codes 0 / 2.
ExitCode ckpt_inspect(const std::string& path);
ExitCode ckpt_verify(const std::string& path);

}  // namespace pipetrain
