#include "pipetrain/ckpt/checkpoint.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/files.hpp"
#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/util/version.hpp"
#include "pipetrain/util/background_job.hpp"
#include "pipetrain/util/faults.hpp"
#include "pipetrain/config/spec_schema.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain {
namespace {

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string shard_name(int stage) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "stage_%03d.h5", stage);
  return buf;
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// step_* directories of a checkpoints folder, newest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) != 0 || !e.is_directory()) continue;
    char* end = nullptr;
    long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (end && *end == '\0') out.emplace_back(step, e.path().string());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

// The spec keys that must match to load a checkpoint: model shape, data stream, batch (the data
// position is counted in global samples, so the global batch fixes which samples come next).
bool must_match(const std::string& key) {  // model.dtype only changes how products round
  return (key.rfind("model.", 0) == 0 && key != "model.dtype") || key == "run.seed" || key.rfind("data.", 0) == 0 ||
         key == "train.global_batch";
}

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
void check_finite(std::vector<ShardTensor>& tensors, const std::vector<size_t>& floats, float* snapshot, int64_t step) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (snapshot && i == tensors.size() / 2) fault_hooks().reach(FaultPoint::kill_in_snapshot, step);  // test-only
    for (const float** a : {&tensors[i].param, &tensors[i].exp_avg, &tensors[i].exp_avg_sq}) {
      if (any_non_finite(*a, floats[i], snapshot))
        throw std::runtime_error("checkpoint not saved: " + tensors[i].name + " holds NaN or Inf");
      if (snapshot) *a = snapshot, snapshot += floats[i];
    }
  }
}

// What a save reads: the array itself on the CPU, a host copy of a GPU's.
const float* host_view(const Floats& a, std::vector<float>& copy) {
  if (!a.on_gpu()) return a.data();
  copy = a.to_host();
  return copy.data();
}

// What a load writes into: the array itself on the CPU, host staging for a GPU's (then upload()).
struct LoadTarget {
  Floats& array;
  std::vector<float> staging;
  explicit LoadTarget(Floats& a) : array(a), staging(a.on_gpu() ? a.size() : 0) {}
  float* data() { return array.on_gpu() ? staging.data() : array.data(); }
  void upload() {
    if (array.on_gpu()) array.assign(staging.data(), staging.size());
  }
};

}  // namespace

std::string Manifest::to_json() const {
  json j;
  j["format"] = format;
  j["step"] = step;
  j["spec_hash"] = spec_hash;
  j["spec"] = spec;
  j["layout"] = {{"pp", pp}, {"dp", dp}, {"virtual_stages", virtual_stages}, {"partition", partition}};
  j["data"] = {{"samples_consumed", samples_consumed}};
  j["optimizer"] = {{"steps", optimizer_steps}};
  // Nothing in a step draws random numbers at run time: init, synthetic data and shuffling are
  // counter-based functions of the seed, so the seed and the data position are the whole state.
  const auto seed = spec.find("run.seed");  // always there in what we write; informational only
  j["rng"] = {{"seed", seed == spec.end() ? "" : seed->second}, {"kind", "counter-based, keyed by seed and sample index"}};
  json shards_json = json::array();
  for (auto& s : shards)
    shards_json.push_back({{"file", s.file}, {"bytes", s.bytes}, {"checksum", hex(s.checksum)}, {"tensors", s.tensors}});
  j["shards"] = shards_json;
  if (!tokenizer.file.empty())
    j["tokenizer"] = {{"kind", "sentencepiece"}, {"file", tokenizer.file}, {"bytes", tokenizer.bytes},
                      {"checksum", hex(tokenizer.checksum)}};
  j["timing"] = {{"write_s", write_s}};
  if (!build.empty()) j["build"] = build;
  return j.dump(2) + "\n";
}

Manifest Manifest::read(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  return parse(read_input_file(path, "checkpoint manifest", 64 << 20), path);
}

Manifest Manifest::parse(const std::string& text, const std::string& path) {
  Manifest m;
  try {
    json j = json::parse(text);
    m.format = j.at("format").get<int>();
    m.step = j.at("step").get<int64_t>();
    m.spec_hash = j.at("spec_hash").get<std::string>();
    m.spec = j.at("spec").get<std::map<std::string, std::string>>();
    m.pp = j.at("layout").at("pp").get<int>();
    m.dp = j.at("layout").at("dp").get<int>();
    m.partition = j.at("layout").at("partition").get<std::vector<int>>();
    // absent in checkpoints from before the interleaved schedule: one chunk per stage
    m.virtual_stages = j.at("layout").value("virtual_stages", 1);
    m.samples_consumed = j.at("data").at("samples_consumed").get<int64_t>();
    // absent in checkpoints from before steps could be skipped: every step was an update then
    m.optimizer_steps = j.contains("optimizer") ? j.at("optimizer").at("steps").get<int64_t>() : m.step;
    for (auto& s : j.at("shards")) {
      Shard sh;
      sh.file = s.at("file").get<std::string>();
      sh.bytes = s.at("bytes").get<uint64_t>();
      sh.checksum = std::stoull(s.at("checksum").get<std::string>(), nullptr, 16);
      sh.tensors = s.at("tensors").get<std::vector<std::string>>();
      m.shards.push_back(std::move(sh));
    }
    if (j.contains("tokenizer")) {
      m.tokenizer.file = j["tokenizer"].at("file").get<std::string>();
      m.tokenizer.bytes = j["tokenizer"].at("bytes").get<uint64_t>();
      m.tokenizer.checksum = std::stoull(j["tokenizer"].at("checksum").get<std::string>(), nullptr, 16);
    }
    m.write_s = j.at("timing").at("write_s").get<double>();
    m.build = j.value("build", "");
  } catch (const json::exception& e) {
    throw SpecError(path + ": not a valid pipetrain manifest (" + e.what() + ")");
  } catch (const std::logic_error& e) {  // stoll / stoull
    throw SpecError(path + ": not a valid pipetrain manifest (" + e.what() + ")");
  }
  if (m.format != kCheckpointFormat)
    throw SpecError(path + ": checkpoint format " + std::to_string(m.format) + ", this pipetrain reads " +
                    std::to_string(kCheckpointFormat));
  // What loading relies on; a hand-edited or damaged manifest must not send it elsewhere.
  auto require = [&](bool ok, const std::string& what) {
    if (!ok) throw SpecError(path + ": not a valid pipetrain manifest (" + what + ")");
  };
  require(m.step >= 0 && m.samples_consumed >= 0, "negative step or data position");
  require(m.optimizer_steps >= 0 && m.optimizer_steps <= m.step, "optimizer.steps outside 0..step");
  require(m.pp >= 1 && m.dp >= 1 && m.virtual_stages >= 1, "layout pp, dp and virtual_stages must be at least 1");
  require(m.partition.size() == static_cast<size_t>(m.pp) * m.virtual_stages,
          "layout.partition needs one entry per virtual stage (pp x virtual_stages)");
  require(m.shards.size() == static_cast<size_t>(m.pp), "shards need one entry per stage");
  for (int b : m.partition) require(b >= 0, "negative block count in layout.partition");
  for (auto& s : m.shards)
    require(!s.file.empty() && s.file.find('/') == std::string::npos && s.file != "." && s.file != "..",
            "shard file '" + s.file + "' is not a plain file name");
  require(m.tokenizer.file.empty() || m.tokenizer.file == kTokenizerFile,
          std::string("tokenizer.file must be ") + kTokenizerFile);
  return m;
}

std::string verify_checkpoint(const std::string& dir, int part, int parts) {
  Manifest m;
  try {
    m = Manifest::read(dir);
  } catch (const SpecError& e) {
    return e.what();
  }
  const std::string mpath = dir + "/manifest.json: ";
  const std::string dirname = fs::path(dir).filename().string();
  if (m.step < 1 || m.step > INT32_MAX) return mpath + "step " + std::to_string(m.step) + " is out of range";
  if (dirname.rfind("step_", 0) == 0 && dirname != step_name(m.step))
    return mpath + "step " + std::to_string(m.step) + " does not match the directory name " + dirname;
  int64_t blocks = 0;
  for (int b : m.partition) blocks += b;
  auto n_layer = m.spec.find("model.n_layer");
  if (m.pp < 1 || m.shards.size() != static_cast<size_t>(m.pp) ||
      m.partition.size() != static_cast<size_t>(m.pp) * m.virtual_stages || n_layer == m.spec.end() ||
      std::to_string(blocks) != n_layer->second)
    return mpath + "layout, partition and shard list do not agree";
  // The model the manifest's spec describes: every tensor it has listed in exactly one shard, at
  // the shape each loader will ask for.
  std::map<std::string, std::vector<int>> shape_of;
  try {
    const RunSpec spec = spec_of_checkpoint(dir, {}, 1);
    for (const ParamTensor& p : stage_params(spec, 0, 1, 0, spec.model.n_layer)) shape_of[p.name] = p.shape;
  } catch (const SpecError& e) {
    return e.what();
  }
  std::map<std::string, std::string> listed_in;
  for (const auto& s : m.shards)
    for (const auto& t : s.tensors) {
      if (!shape_of.count(t))
        return mpath + s.file + " lists tensor " + t + ", which the model its spec describes does not have";
      if (!listed_in.emplace(t, s.file).second)
        return mpath + "tensor " + t + " is listed in both " + listed_in[t] + " and " + s.file;
    }
  for (const auto& [name, shape] : shape_of)
    if (!listed_in.count(name)) return mpath + "no shard lists tensor " + name + " of the model its spec describes";
  for (size_t i = 0; i < m.shards.size(); ++i) {
    if (static_cast<int>(i % parts) != part) continue;
    const auto& s = m.shards[i];
    const std::string path = dir + "/" + s.file;
    uint64_t bytes = 0, sum = 0;
    try {
      sum = file_checksum(path, &bytes);
      if (bytes != s.bytes)
        return path + ": " + std::to_string(bytes) + " bytes, the manifest says " + std::to_string(s.bytes) +
               " (truncated or replaced)";
      if (sum != s.checksum)
        return path + ": checksum " + hex(sum) + " differs from the manifest's " + hex(s.checksum) + " (corrupted)";
      ShardReader r(path);
      if (r.step() != m.step || r.format_version() != kCheckpointFormat)
        return path + ": holds step " + std::to_string(r.step()) + " (format " + std::to_string(r.format_version()) +
               "), the manifest says step " + std::to_string(m.step);
      for (auto& t : s.tensors)
        for (const char* group : {"params", "optim/exp_avg", "optim/exp_avg_sq"})
          if (std::string why = r.problem(group, t, shape_of[t]); !why.empty())
            return why + " (the model manifest.json's spec describes: the manifest and its shard disagree)";
      for (const TensorInfo& t : r.tensors())
        if (std::find(s.tensors.begin(), s.tensors.end(), t.name) == s.tensors.end())
          return path + ": holds tensor " + t.name + ", which manifest.json does not list for it";
    } catch (const std::exception& e) {
      return e.what();
    }
  }
  if (part == 0 && !m.tokenizer.file.empty()) {
    const std::string path = dir + "/" + m.tokenizer.file;
    uint64_t bytes = 0, sum = 0;
    try {
      sum = file_checksum(path, &bytes);
    } catch (const std::exception& e) {
      return e.what();
    }
    if (bytes != m.tokenizer.bytes || sum != m.tokenizer.checksum)
      return path + ": " + std::to_string(bytes) + " bytes, checksum " + hex(sum) + "; the manifest says " +
             std::to_string(m.tokenizer.bytes) + " bytes, checksum " + hex(m.tokenizer.checksum) + " (corrupted)";
  }
  return "";
}

std::vector<std::string> checkpoints_named_by(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::exists(p / "manifest.json", ec)) return {path};
  fs::path folder;
  if (p.filename() == "latest" && fs::is_regular_file(p, ec)) folder = p.parent_path();
  else if (fs::is_directory(p / "checkpoints", ec)) folder = p / "checkpoints";
  else if (fs::is_directory(p, ec)) folder = p;
  std::vector<std::string> out;
  if (!folder.empty())
    for (auto& [step, dir] : list_checkpoints(folder.string())) out.push_back(dir);
  return out;
}

std::string resolve_checkpoint(const std::string& path, const std::string& command) {
  const std::vector<std::string> candidates = checkpoints_named_by(path);
  if (candidates.empty()) {
    std::error_code ec;
    throw SpecError(command + ": " + path + (fs::exists(path, ec) ? " is not a checkpoint" : ": no such file or folder") +
                    " (give a checkpoint RUN_DIR/checkpoints/step_N, a run directory, its checkpoints folder or "
                    "its latest file)");
  }
  const bool exact = candidates.size() == 1 && candidates[0] == path;
  for (const std::string& c : candidates) {
    const std::string problem = verify_checkpoint(c);
    if (problem.empty()) {
      if (!exact)
        std::fprintf(stderr, "%s: using %s, the newest intact checkpoint of %s\n", command.c_str(), c.c_str(),
                     path.c_str());
      return c;
    }
    if (exact) throw SpecError(command + ": checkpoint " + c + " is unusable: " + problem);
    std::fprintf(stderr, "%s: warning: skipping %s: %s\n", command.c_str(), c.c_str(), problem.c_str());
  }
  throw SpecError(command + ": " + path + ": none of its " + std::to_string(candidates.size()) +
                  " checkpoint(s) is intact (each said why above)");
}

std::vector<std::string> changed_training_keys(const Manifest& m, const RunSpec& spec) {
  std::vector<std::string> out;
  for (auto& k : spec_schema()) {
    const std::string key = k.dotted();
    if (key != "run.steps" && key.rfind("train.", 0) != 0) continue;
    auto it = m.spec.find(key);
    if (it != m.spec.end() && it->second != k.show(spec)) out.push_back(key + " " + it->second + " -> " + k.show(spec));
  }
  return out;
}

RunSpec spec_of_checkpoint(const std::string& dir, const std::vector<std::string>& overrides, int world_size) {
  const Manifest m = Manifest::read(dir);
  std::map<std::string, std::string> sections;  // section -> "key = value" lines
  for (const auto& [dotted, value] : m.spec) {
    const size_t dot = dotted.find('.');
    if (dot == std::string::npos) continue;
    sections[dotted.substr(0, dot)] += dotted.substr(dot + 1) + " = " + value + "\n";
  }
  std::string toml;
  for (const auto& [section, lines] : sections) toml += "[" + section + "]\n" + lines;
  const int world = std::max(1, world_size);
  std::vector<std::string> sets = {"parallel.pp=1", "parallel.dp=" + std::to_string(world),
                                   "parallel.partition=uniform", "parallel.schedule=gpipe",
                                   "parallel.virtual_stages=1"};
  sets.insert(sets.end(), overrides.begin(), overrides.end());
  // dp fills the ranks the user's pp leaves (eval --set parallel.pp=2 on 4 ranks: dp 2), unless
  // they set dp too.
  try {
    const RunSpec asked = parse_spec(toml, dir + "/manifest.json", sets, kAnyLayout);
    if (asked.parallel.dp == world && asked.parallel.pp > 1 && world % asked.parallel.pp == 0)
      sets.insert(sets.begin() + 2, "parallel.dp=" + std::to_string(world / asked.parallel.pp));
  } catch (const SpecError&) {
  }  // the parse below says what is wrong
  return parse_spec(toml, dir + "/manifest.json", sets, world_size);
}

std::string incompatibility(const Manifest& m, const RunSpec& spec) {
  for (auto& k : spec_schema()) {
    const std::string key = k.dotted();
    if (!must_match(key)) continue;
    auto it = m.spec.find(key);
    const std::string mine = k.show(spec);
    if (it == m.spec.end()) return key + " is missing from the checkpoint's spec";
    if (it->second != mine) return key + " differs: checkpoint has " + it->second + ", this run has " + mine;
  }
  return "";
}

// An asynchronous save between start_save and its end. The snapshot and the slab list are written
// by the training thread before the job starts and only read by the job; the training thread
// touches neither again until the job is collected (and frees them once written). The job never
// calls MPI or HDF5.
struct Checkpointer::PendingSave {
  int64_t step = 0, optimizer_steps = 0;
  std::vector<int> partition;
  std::string tmp, shard;
  std::vector<std::string> names;  // the tensors in this rank's shard
  double t0 = 0;
  std::vector<float> snapshot;     // this rank's slabs: params, exp_avg, exp_avg_sq of each tensor
  std::vector<SlabBytes> slabs;    // where each goes in the shard file
  uint64_t sums[3] = {0, 0, 0};    // stage, checksum, bytes (the stage's first replica)
  BackgroundJob job;
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
  if (in_flight_[kWriting]) throw std::logic_error("a checkpoint save started while another is being written");
  auto p = std::make_unique<PendingSave>();
  const Topology& topo = comm_.topo();
  p->t0 = now_s(), p->step = step, p->optimizer_steps = opt.steps_taken(), p->partition = partition;
  p->tmp = dir_ + "/.tmp_" + step_name(step);
  p->shard = p->tmp + "/" + shard_name(topo.stage);
  p->sums[0] = static_cast<uint64_t>(topo.stage);
  try {
    prepare(p->tmp);
    std::vector<uint64_t> offsets;
    std::vector<size_t> floats;
    comm_.world().require_agreed([&] {
      std::vector<float> w_copy, m_copy, v_copy;
      std::vector<ShardTensor> tensors =
          slab_tensors(stage, opt, host_view(stage.weights(), w_copy), host_view(opt.exp_avg(), m_copy),
                       host_view(opt.exp_avg_sq(), v_copy), floats);
      size_t total = 0;
      for (size_t f : floats) total += 3 * f;
      p->snapshot.swap(spare_snapshot_);  // the last save's buffer: no new pages to fault in
      p->snapshot.resize(total);
      check_finite(tensors, floats, p->snapshot.data(), step);
      for (const ShardTensor& t : tensors) p->names.push_back(t.name);
      if (topo.dp_rank != 0) return;
      std::vector<TensorInfo> infos;
      for (const ShardTensor& t : tensors) infos.push_back({t.name, std::vector<int64_t>(t.shape.begin(), t.shape.end())});
      try {
        offsets = create_shard_file(p->shard, infos, step);
      } catch (const std::runtime_error& e) {
        throw std::runtime_error(std::string("checkpoint not saved: ") + e.what() + " (" + free_space_note(dir_) + ")");
      }
    });
    offsets.resize(3 * p->names.size());
    comm_.broadcast_in_data(offsets.data(), offsets.size());
    // Slab k of tensor i starts at its dataset's offset plus the rows before this replica's.
    const std::vector<ParamTensor>& params = stage.params();
    size_t i = 0, at = 0;
    for (const ParamTensor& t : params) {
      if (t.tied_copy) continue;
      const uint64_t before = row_slab(t.shape[0], topo.dp_rank, topo.dp).begin * row_elements(t) * sizeof(float);
      for (int k = 0; k < 3; ++k, at += floats[i]) p->slabs.push_back({offsets[3 * i + k] + before, p->snapshot.data() + at, floats[i]});
      ++i;
    }
  } catch (const AgreedExit&) {
    discard(p->tmp);
    spare_snapshot_.swap(p->snapshot);
    throw;
  }
  PendingSave& q = *p;
  q.job.start([this, &q] {
    const std::string error = write_slabs(q.shard, q.slabs, q.step);
    return error.empty() ? error : "checkpoint not saved: " + error + " (" + free_space_note(dir_) + ")";
  });
  in_flight_[kWriting] = std::move(p);
}

std::vector<Checkpointer::Outcome> Checkpointer::advance(Until until) {
  std::vector<Outcome> ended;
  const Topology& topo = comm_.topo();
  auto& writing = in_flight_[kWriting];
  auto& checksumming = in_flight_[kChecksumming];
  auto& publishing = in_flight_[kPublishing];
  for (;;) {
    // One round: every rank says which of its parts still run; a save no rank still works on
    // moves on (oldest first, each into the next stage when that is free), or ends.
    double running[kStages], failed[kStages] = {0, 0, 0};
    for (int s = 0; s < kStages; ++s) running[s] = in_flight_[s] && in_flight_[s]->job.running() ? 1 : 0;
    comm_.allreduce_world(running, kStages);
    for (int s = 0; s < kStages; ++s) {
      if (!in_flight_[s] || running[s] > 0) continue;
      const std::string error = in_flight_[s]->job.collect();
      if (!error.empty()) std::fprintf(stderr, "pipetrain: error: %s\n", error.c_str());
      failed[s] = error.empty() ? 0 : 1;
    }
    comm_.allreduce_world(failed, kStages);
    for (int s = kStages - 1; s >= 0; --s) {
      if (!in_flight_[s] || running[s] > 0 || failed[s] == 0) continue;
      discard(in_flight_[s]->tmp);
      if (s == kWriting) spare_snapshot_.swap(in_flight_[s]->snapshot);
      ended.push_back({in_flight_[s]->step, false, now_s() - in_flight_[s]->t0});
      in_flight_[s].reset();
    }
    if (publishing && running[kPublishing] == 0) {
      ended.push_back({publishing->step, true, now_s() - publishing->t0});
      publishing.reset();
    }
    if (checksumming && running[kChecksumming] == 0 && !publishing) {  // rank 0 writes the manifest and publishes
      PendingSave& p = *checksumming;
      std::vector<uint64_t> all;
      comm_.gather_to_root(p.sums, 3, all);
      if (topo.world_rank == 0)
        p.job.start([this, &p, m = manifest(p.step, p.optimizer_steps, p.partition, all)] {
          complete(m, p.tmp, p.t0);
          return std::string();
        });
      publishing = std::move(checksumming);
    }
    if (writing && running[kWriting] == 0 && !checksumming) {  // the stage's first replica checksums its shard
      PendingSave& p = *writing;
      spare_snapshot_.swap(p.snapshot), p.slabs.clear();  // written: the buffer is free for the next save
      if (topo.dp_rank == 0) {
        std::string problem;
        try {
          check_shard(p.shard, p.names);  // HDF5: here, on the training thread
        } catch (const std::runtime_error& e) {
          problem = e.what();
        }
        p.job.start([&p, problem] {
          if (!problem.empty()) return problem;
          p.sums[1] = file_checksum(p.shard, &p.sums[2]);
          return std::string();
        });
      }
      checksumming = std::move(writing);
    }
    const bool done = until == Until::one_round || (until == Until::room ? !writing : !saving());
    if (done) return ended;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

double Checkpointer::save(int64_t step, Stage& stage, const AdamW& opt, const std::vector<int>& partition) {
  const std::string tmp = dir_ + "/.tmp_" + step_name(step);
  try {
    return write(step, stage, opt, partition, tmp);
  } catch (const AgreedExit&) {
    discard(tmp);
    throw;
  }
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
      if (e.path().filename().string().rfind(".tmp_", 0) == 0 && !in_flight(e.path().string())) fs::remove_all(e.path(), ec);
    fs::create_directories(tmp, ec);
    if (ec) throw std::runtime_error("checkpoint " + tmp + ": cannot create (" + ec.message() + ")");
  });
}

std::vector<ShardTensor> Checkpointer::slab_tensors(const Stage& stage, const AdamW& opt, const float* w,
                                                    const float* m, const float* v, std::vector<size_t>& floats) const {
  // This replica's row slab of every tensor. Under ZeRO-1 the optimizer's shard is that slab, so
  // its moments are all the rank keeps; unsharded, the slab is a part of the whole.
  const Topology& topo = comm_.topo();
  std::vector<ShardTensor> tensors;
  floats.clear();
  const std::vector<ParamTensor>& params = stage.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamTensor& p = params[i];
    if (p.tied_copy) continue;
    const RowRange rows = row_slab(p.shape[0], topo.dp_rank, topo.dp);
    const size_t row = row_elements(p), begin = p.offset + rows.begin * row;
    const OptimizerShard::Slab& kept = opt.shard().slabs()[i];
    const size_t state = kept.state_offset + (begin - kept.begin);
    tensors.push_back({p.name, p.shape, w + begin, m + state, v + state});
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
  m.spec_hash = hex(spec_hash(spec_));
  for (auto& k : spec_schema()) m.spec[k.dotted()] = k.show(spec_);
  m.pp = topo.pp, m.dp = topo.dp, m.partition = partition;
  m.virtual_stages = static_cast<int>(partition.size()) / topo.pp;
  m.samples_consumed = step * spec_.train.global_batch;
  m.optimizer_steps = optimizer_steps;
  m.shards.resize(topo.pp);
  for (int s = 0; s < topo.pp; ++s) {
    m.shards[s].file = shard_name(s);
    for (auto& p : rank_params(spec_, chunks_of(partition, spec_.chunk_placement(), s), static_cast<int>(partition.size())))
      if (!p.tied_copy) m.shards[s].tensors.push_back(p.name);
    const int r = topo.rank_of(s, 0);  // each stage's first replica checksummed its shard
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
  publish(tmp, dir_ + "/" + step_name(m.step), step_name(m.step));
}

double Checkpointer::write(int64_t step, Stage& stage, const AdamW& opt, const std::vector<int>& partition,
                           const std::string& tmp) {
  const double t0 = now_s();
  const Topology& topo = comm_.topo();
  prepare(tmp);

  // Each stage's replicas write its shard together; the first replica then checksums and syncs it.
  std::vector<float> w_copy, m_copy, v_copy;
  const std::string shard = tmp + "/" + shard_name(topo.stage);
  uint64_t mine[3] = {static_cast<uint64_t>(topo.stage), 0, 0};
  comm_.world().require_agreed([&] {
    // GPU arrays are copied to the host here, where a failed copy is agreed on like any other.
    std::vector<size_t> floats;
    std::vector<ShardTensor> tensors =
        slab_tensors(stage, opt, host_view(stage.weights(), w_copy), host_view(opt.exp_avg(), m_copy),
                     host_view(opt.exp_avg_sq(), v_copy), floats);
    check_finite(tensors, floats, nullptr, step);
    fault_hooks().reach(FaultPoint::stall_in_save, step);  // test-only: stop answering mid-save
    const std::string error = write_shard(shard, tensors, step, comm_);
    if (!error.empty()) throw std::runtime_error("checkpoint not saved: " + error + " (" + free_space_note(dir_) + ")");
    sync_path(shard);  // every writer: on network file systems one client's fsync covers only its writes
    if (topo.dp_rank != 0) return;
    std::vector<std::string> names;
    for (auto& t : tensors) names.push_back(t.name);
    check_shard(shard, names);
    mine[1] = file_checksum(shard, &mine[2]);
  });
  std::vector<uint64_t> all;
  comm_.gather_to_root(mine, 3, all);
  comm_.world().require_agreed([&] {
    if (topo.world_rank == 0) complete(manifest(step, opt.steps_taken(), partition, all), tmp, t0);
  });
  return now_s() - t0;
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
  const int64_t newest = list_checkpoints(dir_).front().first;
  int kept = 0;
  for (auto& [step, path] : list_checkpoints(dir_))
    if (step <= newest && ++kept > spec_.checkpoint.keep_last) fs::remove_all(path, ec);  // best effort
}

void Checkpointer::set_aside(const std::string& path) {
  int n = 1;
  std::error_code ec;
  while (fs::exists(path + ".discarded" + std::to_string(n), ec)) ++n;
  fs::rename(path, path + ".discarded" + std::to_string(n));
}

void Checkpointer::discard_newer_than(int64_t step) {
  for (auto& [s, path] : list_checkpoints(dir_))
    if (s > step) set_aside(path);
}

std::string Checkpointer::select(const std::string& resume) {
  if (resume == "never") return "";
  // An explicit PATH that is a run directory, its checkpoints folder or its latest file is taken
  // as auto is: the newest intact checkpoint there, falling back past damaged ones.
  std::vector<std::string> candidates;
  if (resume == "auto")
    for (auto& [step, path] : list_checkpoints(dir_)) candidates.push_back(path);
  else
    candidates = checkpoints_named_by(resume);
  if (resume != "auto" && candidates.empty()) candidates.push_back(resume);  // verify says why it is none
  const bool explicit_path = resume != "auto" && candidates.size() == 1 && candidates[0] == resume;
  const int rank = comm_.world().rank(), world = comm_.world().size();
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string& c = candidates[i];
    std::string problem = verify_checkpoint(c, rank, world);  // each rank checks its share of shards
    const World::Failure f = comm_.world().first_failure(problem.empty() ? ExitCode::ok : ExitCode::bad_input);
    if (f.rank < 0) {
      const std::string why = incompatibility(Manifest::read(c), spec_);  // same verdict on every rank
      if (why.empty() && resume != "auto" && c != resume && rank == 0)
        std::fprintf(stderr, "pipetrain: using %s, the newest intact checkpoint of %s\n", c.c_str(), resume.c_str());
      if (why.empty()) return c;
      if (rank == 0)
        std::fprintf(stderr, "pipetrain: error: cannot resume from %s: %s (%s)\n", c.c_str(), why.c_str(),
                     explicit_path ? "resume from a checkpoint of this model, or drop --resume"
                                   : "a new run.name (or --run-dir) starts this run elsewhere; --resume never starts "
                                     "it here afresh, keeping the old checkpoints aside");
      throw AgreedExit(ExitCode::bad_input);
    }
    if (f.rank == rank)
      std::fprintf(stderr, "pipetrain: %s: checkpoint %s is unusable: %s%s\n", explicit_path ? "error" : "warning",
                   c.c_str(), problem.c_str(),
                   explicit_path ? "" : i + 1 < candidates.size() ? "; falling back to the previous one" : "");
    if (explicit_path) throw AgreedExit(ExitCode::bad_input);
  }
  if (!candidates.empty()) {
    if (rank == 0)
      std::fprintf(stderr, "pipetrain: error: no usable checkpoint in %s; --resume never starts afresh "
                           "(the old checkpoints are kept aside)\n", dir_.c_str());
    throw AgreedExit(ExitCode::bad_input);
  }
  return "";
}

void read_checkpoint_tensors(const std::string& dir, const std::vector<ParamTensor>& params, float* weights,
                             const OptimizerShard* shard, float* exp_avg, float* exp_avg_sq) {
  const Manifest m = Manifest::read(dir);
  std::map<std::string, std::string> shard_of;
  for (auto& s : m.shards)
    for (auto& t : s.tensors) shard_of[t] = dir + "/" + s.file;
  std::map<std::string, std::unique_ptr<ShardReader>> open;
  std::vector<float> whole;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamTensor& p = params[i];
    auto it = shard_of.find(p.name);
    if (it == shard_of.end()) throw SpecError(dir + ": checkpoint has no tensor " + p.name);
    try {
      auto& reader = open[it->second];
      if (!reader) reader = std::make_unique<ShardReader>(it->second);
      reader->read("params", p.name, p.shape, weights + p.offset);
      if (!shard) continue;
      // The moments of the shard's slab of the tensor, at its place in the optimizer's buffers.
      const OptimizerShard::Slab& slab = shard->slabs()[i];
      whole.resize(p.size);
      for (auto [group, out] : {std::pair{"optim/exp_avg", exp_avg}, std::pair{"optim/exp_avg_sq", exp_avg_sq}}) {
        reader->read(group, p.name, p.shape, whole.data());
        std::copy_n(whole.data() + (slab.begin - p.offset), slab.size(), out + slab.state_offset);
      }
    } catch (const std::runtime_error& e) {  // a checkpoint that does not fit is bad input
      throw SpecError(std::string("cannot load checkpoint: ") + e.what());
    }
  }
}

int64_t Checkpointer::load(const std::string& dir, Stage& stage, AdamW& opt) {
  const Manifest m = Manifest::read(dir);
  comm_.world().require_agreed([&] {
    LoadTarget w(stage.weights()), mom(opt.exp_avg()), v(opt.exp_avg_sq());
    read_checkpoint_tensors(dir, stage.params(), w.data(), &opt.shard(), mom.data(), v.data());
    for (LoadTarget* t : {&w, &mom, &v}) t->upload();
  });
  opt.set_steps_taken(static_cast<int>(m.optimizer_steps));
  return m.step;
}

ExitCode ckpt_verify(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / "manifest.json", ec)) {  // one checkpoint
    if (const std::string problem = verify_checkpoint(path); !problem.empty()) throw SpecError(problem);
    const Manifest m = Manifest::read(path);
    std::printf("%s: ok (step %lld, %zu shards match their checksums and the manifest)\n", path.c_str(),
                static_cast<long long>(m.step), m.shards.size());
    return ExitCode::ok;
  }
  // A folder of them: the newest intact one, and the one `latest` names, which a resume or a
  // requeued job would be pointed at.
  const std::string newest = resolve_checkpoint(path, "ckpt verify");
  const fs::path latest = fs::path(newest).parent_path() / "latest";
  std::string named;
  try {
    named = read_input_file(latest.string(), "ckpt verify", 4096);
  } catch (const SpecError&) {
    throw SpecError("ckpt verify: " + latest.string() + " is missing; the newest intact checkpoint is " + newest);
  }
  named.erase(named.find_last_not_of(" \n\r\t") + 1);
  const std::string target = (latest.parent_path() / named).string();
  const std::string problem = named.empty() || named.find('/') != std::string::npos
                                  ? "it names no checkpoint of this folder"
                                  : fs::exists(target, ec) ? verify_checkpoint(target) : target + " does not exist";
  if (!problem.empty())
    throw SpecError("ckpt verify: " + latest.string() + " names " + (named.empty() ? "nothing" : named) + ": " + problem +
                    "; the newest intact checkpoint is " + newest);
  const Manifest m = Manifest::read(target);
  std::printf("%s: ok (latest names step %lld, %zu shards match their checksums and the manifest)%s\n", target.c_str(),
              static_cast<long long>(m.step), m.shards.size(),
              target == newest ? "" : ("; the newest intact checkpoint is " + newest).c_str());
  return ExitCode::ok;
}

ExitCode ckpt_inspect(const std::string& given) {
  // A folder of checkpoints: its newest (inspect reads what the manifest says; verify judges it).
  const std::vector<std::string> named = checkpoints_named_by(given);
  const std::string path = named.empty() ? given : named.front();
  if (path != given) std::fprintf(stderr, "ckpt inspect: %s, the newest checkpoint of %s\n", path.c_str(), given.c_str());
  const Manifest m = Manifest::read(path);  // a SpecError naming the file is the command's bad input
  std::ostringstream partition;
  for (size_t i = 0; i < m.partition.size(); ++i) partition << (i ? "," : "") << m.partition[i];
  const std::string chunks = m.virtual_stages > 1 ? ", " + std::to_string(m.virtual_stages) + " chunks per stage" : "";
  std::printf("checkpoint %s\n  step %lld, %lld samples consumed, saved as pp %d x dp %d%s (blocks per %sstage %s) in %.2f s\n",
              path.c_str(), static_cast<long long>(m.step), static_cast<long long>(m.samples_consumed), m.pp, m.dp,
              chunks.c_str(), m.virtual_stages > 1 ? "virtual " : "", partition.str().c_str(), m.write_s);
  uint64_t total_bytes = 0, total_params = 0;
  for (auto& s : m.shards) {
    std::printf("  %s  %llu bytes  checksum %s\n", s.file.c_str(), static_cast<unsigned long long>(s.bytes),
                hex(s.checksum).c_str());
    total_bytes += s.bytes;
    try {
      ShardReader r(path + "/" + s.file);
      for (auto& t : r.tensors()) {
        uint64_t n = 1;
        std::string shape;
        for (size_t d = 0; d < t.shape.size(); ++d) n *= t.shape[d], shape += (d ? "x" : "") + std::to_string(t.shape[d]);
        total_params += n;
        std::printf("    %-28s %-12s %10llu params %12llu bytes (x3 with the AdamW moments)\n", t.name.c_str(),
                    shape.c_str(), static_cast<unsigned long long>(n), static_cast<unsigned long long>(4 * n));
      }
    } catch (const std::exception& e) {
      std::printf("    (cannot read: %s)\n", e.what());
    }
  }
  std::printf("  total %llu parameters (+ 2 AdamW moments each), %llu bytes on disk\n",
              static_cast<unsigned long long>(total_params), static_cast<unsigned long long>(total_bytes));
  return ExitCode::ok;
}

}  // namespace pipetrain
