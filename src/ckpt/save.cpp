#include "pipetrain/ckpt/save.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "pipetrain/config/spec_schema.hpp"
#include "pipetrain/model/optimizer_shard.hpp"
#include "pipetrain/util/background_job.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/faults.hpp"
#include "pipetrain/util/files.hpp"
#include "pipetrain/util/version.hpp"

namespace fs = std::filesystem;

namespace pipetrain {
namespace {

// Whether any of n floats is Inf or NaN (exponent all ones), copying them to `copy` if given: one
// pass over memory, vectorised (the bit test needs no floating-point compare).
bool any_non_finite(const float* __restrict src, size_t n, float* __restrict copy) {
  uint32_t bad = 0;
  if (copy) {
    for (size_t k = 0; k < n; ++k) {
      uint32_t bits;
      std::memcpy(&bits, src + k, sizeof bits);
      std::memcpy(copy + k, &bits, sizeof bits);
      bad |= (bits & 0x7f800000u) == 0x7f800000u;
    }
  } else {
    for (size_t k = 0; k < n; ++k) {
      uint32_t bits;
      std::memcpy(&bits, src + k, sizeof bits);
      bad |= (bits & 0x7f800000u) == 0x7f800000u;
    }
  }
  return bad != 0;
}

// Training skips non-finite steps, so this never fires; it keeps the promise that no checkpoint
// holds a NaN even if some future path lets one through. With a snapshot (3 x the floats) the
// arrays are copied there in the same pass, and the tensors then point at the copies.
// The rows of a tensor this rank writes: its replica's slab, among the data group's replicas, or
// for an expert part of expert parallelism among the replicas holding the same experts (each
// expert group writes its own experts' rows: together every row once).
RowRange saved_rows(const ParamTensor& p, const Topology& topo) {
  return p.expert ? row_slab(p.shape[0], topo.expert_replica(), topo.expert_replicas())
                  : row_slab(p.shape[0], topo.dp_rank, topo.dp);
}

void check_finite(std::vector<ShardTensor>& tensors, const std::vector<size_t>& floats, float* snapshot, int64_t step) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (snapshot && i == tensors.size() / 2) fault_hooks().reach(FaultPoint::kill_in_snapshot, step);  // test-only
    for (const float** a : {&tensors[i].param, &tensors[i].exp_avg, &tensors[i].exp_avg_sq}) {
      if (any_non_finite(*a, floats[i], snapshot))
        throw std::runtime_error("checkpoint not saved: " + tensors[i].name + " holds NaN or Inf");
      if (snapshot) {
        *a = snapshot;
        snapshot += floats[i];
      }
    }
  }
}

// What a save reads: the array itself on the CPU, a host copy of a GPU's.
const float* host_view(const Floats& a, std::vector<float>& copy) {
  if (!a.on_gpu()) return a.data();
  copy = a.to_host();
  return copy.data();
}

}  // namespace

// A save between its start and its end. Its slab list, and a background save's snapshot, are
// written by the training thread before the job that writes them starts and only read by the job;
// the training thread touches neither again until the job is collected (and frees them once
// written). The job never calls MPI or HDF5. A save run to completion has no snapshot: its slabs
// point at the arrays themselves (a GPU's copied to the host), which nothing changes before it ends.
struct Checkpointer::PendingSave {
  int64_t step = 0, optimizer_steps = 0;
  std::vector<int> partition;
  std::string tmp, shard;
  std::vector<std::string> names;  // the tensors in this rank's shard
  double t0 = 0;
  bool background = true;        // false: run to completion by save()
  std::vector<float> snapshot;   // background: this rank's slabs, params, exp_avg, exp_avg_sq of each tensor
  std::vector<float> host[3];    // run to completion on a GPU: weights, exp_avg, exp_avg_sq copied to the host
  std::vector<SlabBytes> slabs;  // where each slab goes in the shard file
  uint64_t sums[3] = {0, 0, 0};  // stage, checksum, bytes (the stage's first replica)
  BackgroundJob job;
  bool failed = false;  // run to completion: its current stage's work failed on some rank (agreed)
};

Checkpointer::Checkpointer(const RunSpec& spec, const std::string& run_dir, Comm& comm)
    : spec_(spec), dir_(run_dir + "/checkpoints"), comm_(comm) {}

Checkpointer::~Checkpointer() = default;

bool Checkpointer::in_flight(const std::string& tmp) const {
  for (auto& p : in_flight_)
    if (p && p->tmp == tmp) return true;
  return false;
}

void Checkpointer::start_save(int64_t step, Stage& stage, const AdamW& opt, const std::vector<int>& partition) {
  begin(step, stage, opt, partition, true);
}

double Checkpointer::save(int64_t step, Stage& stage, const AdamW& opt, const std::vector<int>& partition) {
  // advance would end the saves in flight too, and their outcomes would be lost here.
  if (saving()) throw std::logic_error("a checkpoint save run to completion while another is in flight");
  begin(step, stage, opt, partition, false);
  const std::vector<Outcome> ended = advance(Until::all_ended);  // this save's outcome alone
  if (ended.empty() || !ended.front().saved) throw AgreedExit(ExitCode::fault);
  return ended.front().seconds;
}

void Checkpointer::begin(int64_t step, Stage& stage, const AdamW& opt, const std::vector<int>& partition,
                         bool background) {
  if (in_flight_[kWriting]) throw std::logic_error("a checkpoint save started while another is being written");
  auto p = std::make_unique<PendingSave>();
  const Topology& topo = comm_.topo();
  p->t0 = now_s();
  p->step = step;
  p->optimizer_steps = opt.steps_taken();
  p->partition = partition;
  p->background = background;
  p->tmp = dir_ + "/.tmp_" + checkpoint_name(step);
  p->shard = p->tmp + "/" + shard_file_name(topo.stage);
  p->sums[0] = static_cast<uint64_t>(topo.stage);
  try {
    prepare(p->tmp);
    std::vector<ShardTensor> tensors;
    std::vector<size_t> floats;
    std::vector<uint64_t> offsets = snapshot_and_create(*p, stage, opt, tensors, floats);
    place_slabs(*p, stage, tensors, floats, std::move(offsets));
  } catch (const AgreedExit&) {
    discard(p->tmp);
    release_snapshot(*p);
    throw;
  }
  PendingSave& q = *p;
  in_flight_[kWriting] = std::move(p);
  run_stage_work(q, [this, &q] {
    const std::string error = write_slabs(q.shard, q.slabs, q.step);
    return error.empty() ? error : "checkpoint not saved: " + error + " (" + free_space_note(dir_) + ")";
  });
}

// Agreed by all ranks: this rank's row slab of every tensor, checked finite (a background save
// copies it into its snapshot in the same pass, and the tensors then point at the copies); then
// the stage's first replica creates the shard file, every dataset allocated. Returns the datasets'
// offsets in the file (on that replica; empty on the others).
std::vector<uint64_t> Checkpointer::snapshot_and_create(PendingSave& p, Stage& stage, const AdamW& opt,
                                                        std::vector<ShardTensor>& tensors,
                                                        std::vector<size_t>& floats) {
  std::vector<uint64_t> offsets;
  comm_.world().require_agreed([&] {
    // GPU arrays are copied to the host here, where a failed copy is agreed on like any other; a
    // background save needs the copies only until they are in its snapshot.
    std::vector<float> scratch[3];
    std::vector<float>* host = p.background ? scratch : p.host;
    const Floats& weights = opt.shard().shards_weights() ? opt.weight_shard() : stage.weights();  // ZeRO-3: the master
    tensors = slab_tensors(stage, opt, host_view(weights, host[0]), host_view(opt.exp_avg(), host[1]),
                           host_view(opt.exp_avg_sq(), host[2]), floats);
    float* copy = nullptr;
    if (p.background) {
      size_t total = 0;
      for (size_t f : floats) total += 3 * f;
      p.snapshot.swap(spare_snapshot_);  // the last save's buffer: no new pages to fault in
      p.snapshot.resize(total);
      copy = p.snapshot.data();
    }
    check_finite(tensors, floats, copy, p.step);
    fault_hooks().reach(FaultPoint::stall_in_save, p.step);  // test-only: stop answering mid-save
    for (const ShardTensor& t : tensors) p.names.push_back(t.name);
    if (!comm_.topo().leads_stage()) return;
    std::vector<TensorInfo> infos;
    for (const ShardTensor& t : tensors)
      infos.push_back({t.name, std::vector<int64_t>(t.shape.begin(), t.shape.end())});
    try {
      offsets = create_shard_file(p.shard, infos, p.step);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(std::string("checkpoint not saved: ") + e.what() + " (" + free_space_note(dir_) + ")");
    }
  });
  return offsets;
}

// Where each of this rank's slabs goes: its dataset's offset, which the stage's first rank
// broadcasts, plus where this replica's rows of this tensor rank's part lie in the whole tensor
// (one run unless tensor ranks split it: then a run per row of a column split, per group of rows
// of a row split).
void Checkpointer::place_slabs(PendingSave& p, const Stage& stage, const std::vector<ShardTensor>& tensors,
                               const std::vector<size_t>& floats, std::vector<uint64_t> offsets) const {
  const Topology& topo = comm_.topo();
  offsets.resize(3 * tensors.size());
  comm_.broadcast_in_stage(offsets.data(), offsets.size());
  size_t i = 0;
  for (const ParamTensor& t : stage.params()) {
    if (t.tied_copy) continue;
    const size_t begin = saved_rows(t, topo).begin * row_elements(t);
    const std::vector<ElementRun> runs = whole_runs(t.tp, t.shape, begin, begin + floats[i]);
    const float* arrays[3] = {tensors[i].param, tensors[i].exp_avg, tensors[i].exp_avg_sq};
    for (int k = 0; k < 3; ++k)
      for (const ElementRun& r : runs)
        p.slabs.push_back({offsets[3 * i + k] + r.whole * sizeof(float), arrays[k] + (r.local - begin), r.count});
    ++i;
  }
}

// A stage's work on this rank (empty: none here). A background save hands it to its job. A save
// run to completion does it now and agrees on the outcome at once, the first failing rank saying
// why, as every agreed step of the run does.
void Checkpointer::run_stage_work(PendingSave& p, std::function<std::string()> work) {
  if (p.background) {
    if (work) p.job.start(std::move(work));
    return;
  }
  const ExitCode code = comm_.world().run_agreed([&] {
    if (!work) return;
    if (const std::string error = work(); !error.empty()) throw std::runtime_error(error);
  });
  p.failed = code != ExitCode::ok;
}

std::vector<Checkpointer::Outcome> Checkpointer::advance(Until until) {
  std::vector<Outcome> ended;
  auto& writing = in_flight_[kWriting];
  auto& checksumming = in_flight_[kChecksumming];
  auto& publishing = in_flight_[kPublishing];
  for (;;) {
    // One round: a save no rank still works on moves on (oldest first, each into the next stage
    // when that is free), or ends.
    double running[kStages], failed[kStages];
    agree_round(running, failed);
    end_failed(running, failed, ended);
    if (publishing && running[kPublishing] == 0) {
      ended.push_back({publishing->step, true, now_s() - publishing->t0});
      publishing.reset();
    }
    if (checksumming && running[kChecksumming] == 0 && !publishing) {
      begin_publish(*checksumming);
      publishing = std::move(checksumming);
    }
    if (writing && running[kWriting] == 0 && !checksumming) {
      begin_checksum(*writing);
      checksumming = std::move(writing);
    }
    if (until == Until::one_round || (until == Until::room ? !writing : !saving())) return ended;
    bool in_background = false;  // the same on every rank; a save run to completion has nothing to wait for
    for (auto& p : in_flight_) in_background = in_background || (p && p->background);
    if (in_background) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Every rank says which of its saves' stages still work; a stage no rank works on any more is
// collected, each background failure said by the rank it happened on (a save run to completion
// has agreed on and said its own), and the failures are agreed.
void Checkpointer::agree_round(double running[], double failed[]) {
  for (int s = 0; s < kStages; ++s) running[s] = in_flight_[s] && in_flight_[s]->job.running() ? 1 : 0;
  comm_.allreduce_world(running, kStages);
  for (int s = 0; s < kStages; ++s) {
    failed[s] = 0;
    if (!in_flight_[s] || running[s] > 0) continue;
    const std::string error = in_flight_[s]->job.collect();
    if (!error.empty()) std::fprintf(stderr, "pipetrain: error: %s\n", error.c_str());
    failed[s] = error.empty() && !in_flight_[s]->failed ? 0 : 1;
  }
  comm_.allreduce_world(failed, kStages);
}

void Checkpointer::end_failed(const double running[], const double failed[], std::vector<Outcome>& ended) {
  for (int s = kStages - 1; s >= 0; --s) {
    std::unique_ptr<PendingSave>& p = in_flight_[s];
    if (!p || running[s] > 0 || failed[s] == 0) continue;
    discard(p->tmp);
    release_snapshot(*p);
    ended.push_back({p->step, false, now_s() - p->t0});
    p.reset();
  }
}

// Written on every rank: the snapshot is free for the next save; the stage's first replica reads
// its shard back (HDF5: here, on the training thread) and checksums it.
void Checkpointer::begin_checksum(PendingSave& p) {
  release_snapshot(p);
  std::function<std::string()> work;
  if (comm_.topo().leads_stage()) {
    std::string problem;
    try {
      check_shard(p.shard, p.names);
    } catch (const std::runtime_error& e) {
      problem = e.what();
    }
    work = [&p, problem] {
      if (!problem.empty()) return problem;
      p.sums[1] = file_checksum(p.shard, &p.sums[2]);
      return std::string();
    };
  }
  run_stage_work(p, std::move(work));
}

// Checksummed on every rank: rank 0 writes the manifest and publishes.
void Checkpointer::begin_publish(PendingSave& p) {
  std::vector<uint64_t> all;
  comm_.gather_to_root(p.sums, 3, all);
  std::function<std::string()> work;
  if (comm_.topo().world_rank == 0)
    work = [this, &p, m = manifest(p.step, p.optimizer_steps, p.partition, all)] {
      complete(m, p.tmp, p.t0);
      return std::string();
    };
  run_stage_work(p, std::move(work));
}

// The snapshot buffer goes back for the next background save (unless it never left); GPU host
// copies are freed.
void Checkpointer::release_snapshot(PendingSave& p) {
  if (spare_snapshot_.capacity() == 0) spare_snapshot_.swap(p.snapshot);
  p.slabs.clear();
  for (std::vector<float>& h : p.host) std::vector<float>().swap(h);
}

// Free what a failed attempt wrote (a full disk must not stay full because of it); what was
// published before is not touched.
void Checkpointer::discard(const std::string& tmp) {
  std::error_code ec;
  if (comm_.topo().world_rank == 0) fs::remove_all(tmp, ec);
}

void Checkpointer::prepare(const std::string& tmp) {
  comm_.world().require_agreed([&] {
    if (comm_.topo().world_rank != 0) return;
    std::error_code ec;
    for (auto& e : fs::directory_iterator(dir_, ec))  // leftovers of saves that died mid-way
      if (e.path().filename().string().rfind(".tmp_", 0) == 0 && !in_flight(e.path().string()))
        fs::remove_all(e.path(), ec);
    fs::create_directories(tmp, ec);
    if (ec) throw std::runtime_error("checkpoint " + tmp + ": cannot create (" + ec.message() + ")");
  });
}

std::vector<ShardTensor> Checkpointer::slab_tensors(const Stage& stage, const AdamW& opt, const float* w,
                                                    const float* m, const float* v, std::vector<size_t>& floats) const {
  // This replica's row slab of every tensor. Sharded, the optimizer's shard is that slab, so its
  // moments (and under ZeRO-3 the weights, `w` then the compact master copy) are all the rank
  // keeps; unsharded, the slab is a part of the whole.
  const Topology& topo = comm_.topo();
  std::vector<ShardTensor> tensors;
  floats.clear();
  const std::vector<ParamTensor>& params = stage.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamTensor& p = params[i];
    if (p.tied_copy) continue;
    const RowRange rows = saved_rows(p, topo);
    const size_t row = row_elements(p), begin = p.offset + rows.begin * row;
    const OptimizerShard::Slab& kept = opt.shard().slabs()[i];
    const size_t state = kept.state_offset + (begin - kept.begin);
    tensors.push_back({p.name, p.tp.whole, w + (opt.shard().shards_weights() ? state : begin), m + state, v + state});
    floats.push_back((rows.end - rows.begin) * row);
  }
  return tensors;
}

void Checkpointer::check_shard(const std::string& shard, const std::vector<std::string>& names) const {
  // Read the shard back before vouching for it with a checksum: a file HDF5 cannot open or that
  // lacks a tensor must never be published.
  ShardReader check(shard);
  for (auto& n : names)
    if (!check.has(n)) throw std::runtime_error("checkpoint not saved: " + shard + " lacks " + n);
}

Manifest Checkpointer::manifest(int64_t step, int64_t optimizer_steps, const std::vector<int>& partition,
                                const std::vector<uint64_t>& sums) const {
  const Topology& topo = comm_.topo();
  Manifest m;
  m.format = kCheckpointFormat;
  m.step = step;
  m.spec_hash = hex16(spec_hash(spec_));
  for (auto& k : spec_schema()) m.spec[k.dotted()] = k.show(spec_);
  m.pp = topo.pp;
  m.dp = topo.dp;
  m.partition = partition;
  m.virtual_stages = static_cast<int>(partition.size()) / topo.pp;
  m.samples_consumed = step * spec_.train.global_batch;
  if (source_tokens_) m.tokens_by_source = source_tokens_(m.samples_consumed);
  m.optimizer_steps = optimizer_steps;
  m.shards.resize(topo.pp);
  for (int s = 0; s < topo.pp; ++s) {
    m.shards[s].file = shard_file_name(s);
    for (auto& p :
         rank_params(spec_, chunks_of(partition, spec_.chunk_placement(), s), static_cast<int>(partition.size())))
      if (!p.tied_copy) m.shards[s].tensors.push_back(p.name);
    const int r = topo.rank_of(s, 0, 0);  // each stage's first rank checksummed its shard
    m.shards[s].checksum = sums[3 * r + 1];
    m.shards[s].bytes = sums[3 * r + 2];
  }
  m.build = version_string();
  return m;
}

void Checkpointer::complete(Manifest m, const std::string& tmp, double t0) {
  if (!tokenizer_.empty()) {
    write_file_atomically(tmp + "/" + kTokenizerFile, tokenizer_);
    m.tokenizer.file = kTokenizerFile;
    m.tokenizer.checksum = file_checksum(tmp + "/" + kTokenizerFile, &m.tokenizer.bytes);
  }
  m.write_s = now_s() - t0;
  write_file_atomically(tmp + "/manifest.json", m.to_json());
  publish(tmp, dir_ + "/" + checkpoint_name(m.step), checkpoint_name(m.step));
}

// Rank 0: the rename that makes a checkpoint exist, then `latest`, then pruning of old ones.
void Checkpointer::publish(const std::string& tmp, const std::string& final_dir, const std::string& name) {
  sync_path(tmp);
  std::error_code ec;
  if (fs::exists(final_dir, ec)) set_aside(final_dir);  // never overwrite what was saved before
  fs::rename(tmp, final_dir);
  sync_path(dir_);
  write_file_atomically(dir_ + "/latest", name + "\n");
  // keep_last counts complete checkpoints up to the new one; newer ones cannot exist here (a
  // resume sets them aside) and the new one is never removed.
  if (spec_.checkpoint.keep_last <= 0) return;
  const int64_t newest = checkpoints_in(dir_).front().first;
  int kept = 0;
  for (auto& [step, path] : checkpoints_in(dir_))
    if (step <= newest && ++kept > spec_.checkpoint.keep_last) fs::remove_all(path, ec);  // best effort
}

void Checkpointer::set_aside(const std::string& path) {
  int n = 1;
  std::error_code ec;
  while (fs::exists(path + ".discarded" + std::to_string(n), ec)) ++n;
  fs::rename(path, path + ".discarded" + std::to_string(n));
}

void Checkpointer::discard_newer_than(int64_t step) {
  for (auto& [s, path] : checkpoints_in(dir_))
    if (s > step) set_aside(path);
}

}  // namespace pipetrain
