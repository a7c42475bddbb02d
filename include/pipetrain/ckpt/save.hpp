// Saving checkpoints (the layout: ckpt/manifest.hpp).
//
// Atomic: shards and manifest are written into .tmp_step_NNNNNNNN, fsynced, and the directory is
// renamed into place; only then is `latest` replaced (write + fsync + rename). A step_* directory
// therefore always holds a complete checkpoint, and a crash at any moment leaves the previous one
// usable.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/ckpt/manifest.hpp"
#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/dist/comm.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optim.hpp"

namespace pipetrain {

class Checkpointer {
 public:
  Checkpointer(const RunSpec& spec, const std::string& run_dir, Comm& comm);
  ~Checkpointer();
  std::string dir() const { return dir_; }  // RUN_DIR/checkpoints
  // Rank 0: the SentencePiece model every checkpoint carries from now on ("" for none).
  void set_tokenizer(std::string model) { tokenizer_ = std::move(model); }
  // Rank 0: a mixture's training tokens per source after `samples` global samples, which every
  // manifest records (unset: none).
  using SourceTokens = std::function<std::vector<std::pair<std::string, int64_t>>(int64_t samples)>;
  void set_source_tokens(SourceTokens count) { source_tokens_ = std::move(count); }

  // A save goes through three stages: its shard's bytes written, its shard read back and
  // checksummed (the stage's first replica), the manifest written and the checkpoint published
  // (rank 0). Each stage's outcome is agreed by all ranks before the save moves on, and what a
  // failed save wrote is removed, the previous checkpoints untouched.
  //
  // checkpoint.async. start_save (collective) does what training must wait for: the shard files
  // are created with their structure (HDF5, on this thread) and this rank's slabs are copied into
  // a host snapshot; their bytes are then written and fsynced on a background thread while
  // training goes on. advance (collective, at step boundaries) moves saves on whenever every rank
  // has finished its part: once written the snapshot is free again and the shards are read back
  // and checksummed, then rank 0 writes the manifest and publishes; the next save may be written
  // meanwhile, and publishes after it. advance returns the saves that ended (a failure: the failing
  // rank has said why); `until` says how long to go on: one round, until a new save may start (no
  // snapshot held), or until no save is in flight. start_save throws AgreedExit on every rank if
  // any rank failed before the write began (the failing rank has said why).
  struct Outcome {
    int64_t step;
    bool saved;
    double seconds;  // from the start of the save to published (or to the failure)
  };
  enum class Until { one_round, room, all_ended };
  void start_save(int64_t step, Stage& stage, const AdamW& opt, const std::vector<int>& partition);
  std::vector<Outcome> advance(Until until);
  bool saving() const { return in_flight_[0] || in_flight_[1] || in_flight_[2]; }

  // Collective, with no save in flight: the same save run to completion before it returns, every
  // stage's work done on this thread and agreed at once (no snapshot: training waits). Returns the
  // seconds it took; throws AgreedExit on every rank if any rank failed (the failing rank has said
  // why).
  double save(int64_t step, Stage& stage, const AdamW& opt, const std::vector<int>& partition);

  // Rank 0, after resuming at `step`: checkpoints of this run newer than it belong to a future
  // that will now be recomputed; they are renamed step_N.discardedK (kept, never loaded again).
  void discard_newer_than(int64_t step);

 private:
  struct PendingSave;
  // A save's first stage, in the background or to be run to completion.
  void begin(int64_t step, Stage& stage, const AdamW& opt, const std::vector<int>& partition, bool background);
  std::vector<uint64_t> snapshot_and_create(PendingSave& p, Stage& stage, const AdamW& opt,
                                            std::vector<ShardTensor>& tensors, std::vector<size_t>& floats);
  void place_slabs(PendingSave& p, const Stage& stage, const std::vector<ShardTensor>& tensors,
                   const std::vector<size_t>& floats, std::vector<uint64_t> offsets) const;
  void run_stage_work(PendingSave& p, std::function<std::string()> work);
  // advance's parts: which stages ended on every rank and which of them failed (agreed), the
  // failed saves removed, the others moved into their next stage.
  void agree_round(double running[], double failed[]);
  void end_failed(const double running[], const double failed[], std::vector<Outcome>& ended);
  void begin_checksum(PendingSave& p);
  void begin_publish(PendingSave& p);
  void release_snapshot(PendingSave& p);
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
  SourceTokens source_tokens_;
  // Saves in flight, at most one per stage of the way: its snapshot being written, its shards
  // being read back and checksummed, rank 0 writing its manifest and renaming it into place. Each
  // moves on when the next stage is free, so they publish in step order.
  static constexpr int kWriting = 0, kChecksumming = 1, kPublishing = 2, kStages = 3;
  std::unique_ptr<PendingSave> in_flight_[kStages];
  bool in_flight(const std::string& tmp) const;  // a save in flight writes to this temporary directory
  std::vector<float> spare_snapshot_;            // the snapshot buffer between background saves, kept for the next
};

}  // namespace pipetrain
