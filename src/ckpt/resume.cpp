#include "pipetrain/ckpt/resume.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>

#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/config/spec_schema.hpp"

namespace fs = std::filesystem;

namespace pipetrain {

ResumeFrom ResumeFrom::parse(const std::string& text) {
  if (text == "auto") return {ResumeMode::automatic};
  if (text == "never") return {ResumeMode::never};
  return {ResumeMode::path, text};
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
    for (auto& [step, dir] : checkpoints_in(folder.string())) out.push_back(dir);
  return out;
}

std::string resolve_checkpoint(const std::string& path, const std::string& command) {
  const std::vector<std::string> candidates = checkpoints_named_by(path);
  if (candidates.empty()) {
    std::error_code ec;
    throw SpecError(command + ": " + path +
                    (fs::exists(path, ec) ? " is not a checkpoint" : ": no such file or folder") +
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

namespace {

// The spec keys that must match to load a checkpoint: model shape; to train on from it, also the
// data stream and batch (the data position is counted in global samples, so the global batch fixes
// which samples come next).
bool must_match(const std::string& key, bool model_only) {  // model.dtype only changes how products round
  if (key.rfind("model.", 0) == 0) return key != "model.dtype";
  return !model_only && (key == "run.seed" || key.rfind("data.", 0) == 0 || key == "train.global_batch");
}

}  // namespace

std::string incompatibility(const Manifest& m, const RunSpec& spec, bool model_only) {
  for (auto& k : spec_schema()) {
    const std::string key = k.dotted();
    if (!must_match(key, model_only)) continue;
    const std::string mine = k.show(spec), saved = m.spec_value(key);
    if (saved != mine) return key + " differs: checkpoint has " + saved + ", this run has " + mine;
  }
  return "";
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

namespace {

// The checkpoints a start may resume from, newest first. A path that is a run directory, its
// checkpoints folder or its latest file is taken as automatic resumption is: the newest intact
// checkpoint there, falling back past damaged ones.
std::vector<std::string> resume_candidates(const ResumeFrom& resume, const std::string& checkpoints) {
  std::vector<std::string> candidates;
  if (resume.mode == ResumeMode::automatic) {
    for (auto& [step, path] : checkpoints_in(checkpoints)) candidates.push_back(path);
    return candidates;
  }
  candidates = checkpoints_named_by(resume.path);
  if (candidates.empty()) candidates.push_back(resume.path);  // verify says why it is none
  return candidates;
}

// An intact checkpoint (every rank verified its share): taken when this run's spec may resume it,
// otherwise refused on every rank (the same verdict everywhere), saying how to go on.
std::string take_if_compatible(const std::string& c, const ResumeFrom& resume, bool explicit_path, const RunSpec& spec,
                               int rank) {
  const std::string why = incompatibility(Manifest::read(c), spec, resume.model_only);
  if (why.empty()) {
    if (resume.mode == ResumeMode::path && c != resume.path && rank == 0)
      std::fprintf(stderr, "pipetrain: using %s, the newest intact checkpoint of %s\n", c.c_str(), resume.path.c_str());
    return c;
  }
  if (rank == 0)
    std::fprintf(stderr, "pipetrain: error: cannot resume from %s: %s (%s)\n", c.c_str(), why.c_str(),
                 explicit_path ? "resume from a checkpoint of this model, or drop --resume"
                               : "a new run.name (or --run-dir) starts this run elsewhere; --resume never starts "
                                 "it here afresh, keeping the old checkpoints aside");
  throw AgreedExit(ExitCode::bad_input);
}

}  // namespace

std::string select_checkpoint(const ResumeFrom& resume, const std::string& checkpoints, const RunSpec& spec,
                              World& world) {
  if (resume.mode == ResumeMode::never) return "";
  const std::vector<std::string> candidates = resume_candidates(resume, checkpoints);
  const bool explicit_path = resume.mode == ResumeMode::path && candidates.size() == 1 && candidates[0] == resume.path;
  const int rank = world.rank();
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string& c = candidates[i];
    const std::string problem = verify_checkpoint(c, rank, world.size());  // each rank checks its share of shards
    const World::Failure f = world.first_failure(problem.empty() ? ExitCode::ok : ExitCode::bad_input);
    if (f.rank < 0) return take_if_compatible(c, resume, explicit_path, spec, rank);
    if (f.rank == rank)
      std::fprintf(stderr, "pipetrain: %s: checkpoint %s is unusable: %s%s\n", explicit_path ? "error" : "warning",
                   c.c_str(), problem.c_str(),
                   explicit_path               ? ""
                   : i + 1 < candidates.size() ? "; falling back to the previous one"
                                               : "");
    if (explicit_path) throw AgreedExit(ExitCode::bad_input);
  }
  if (!candidates.empty()) {
    if (rank == 0)
      std::fprintf(stderr,
                   "pipetrain: error: no usable checkpoint in %s; --resume never starts afresh "
                   "(the old checkpoints are kept aside)\n",
                   checkpoints.c_str());
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
  std::vector<float> whole, part;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamTensor& p = params[i];
    auto it = shard_of.find(p.name);
    if (it == shard_of.end()) throw SpecError(dir + ": checkpoint has no tensor " + p.name);
    try {
      auto& reader = open[it->second];
      if (!reader) reader = std::make_unique<ShardReader>(it->second);
      // The checkpoint holds whole tensors: a tensor rank takes its part.
      auto read_part = [&](const char* group, float* out) {
        if (!p.split()) return reader->read(group, p.name, p.shape, out);
        whole.resize(p.tp.whole_size());
        reader->read(group, p.name, p.tp.whole, whole.data());
        take_part(p.tp, p.shape, whole.data(), out);
      };
      read_part("params", weights + p.offset);
      if (!shard) continue;
      // The moments of the shard's slab of the tensor, at its place in the optimizer's buffers.
      const OptimizerShard::Slab& slab = shard->slabs()[i];
      part.resize(p.size);
      for (auto [group, out] : {std::pair{"optim/exp_avg", exp_avg}, std::pair{"optim/exp_avg_sq", exp_avg_sq}}) {
        read_part(group, part.data());
        std::copy_n(part.data() + (slab.begin - p.offset), slab.size(), out + slab.state_offset);
      }
    } catch (const std::runtime_error& e) {  // a checkpoint that does not fit is bad input
      throw SpecError(std::string("cannot load checkpoint: ") + e.what());
    }
  }
}

namespace {

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

int64_t load_checkpoint(const std::string& dir, Stage& stage, AdamW& opt, World& world) {
  const Manifest m = Manifest::read(dir);
  world.require_agreed([&] {
    LoadTarget w(stage.weights()), mom(opt.exp_avg()), v(opt.exp_avg_sq());
    read_checkpoint_tensors(dir, stage.params(), w.data(), &opt.shard(), mom.data(), v.data());
    for (LoadTarget* t : {&w, &mom, &v}) t->upload();
  });
  opt.set_steps_taken(static_cast<int>(m.optimizer_steps));
  return m.step;
}

}  // namespace pipetrain
