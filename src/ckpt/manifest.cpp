#include "pipetrain/ckpt/manifest.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/config/spec_schema.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/util/files.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain {

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string shard_file_name(int stage) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "stage_%03d.h5", stage);
  return buf;
}

std::string hex16(uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

std::vector<std::pair<int64_t, std::string>> checkpoints_in(const std::string& folder) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) != 0 || !e.is_directory()) continue;
    char* end = nullptr;
    long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (end && *end == '\0') out.emplace_back(step, e.path().string());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

std::string Manifest::spec_value(const std::string& dotted) const {
  if (auto it = spec.find(dotted); it != spec.end()) return it->second;
  if (const SpecKey* k = find_spec_key(dotted)) return k->show(RunSpec{});
  throw std::logic_error("no spec key " + dotted);
}

std::string Manifest::to_json() const {
  json j;
  j["format"] = format;
  j["step"] = step;
  j["spec_hash"] = spec_hash;
  j["spec"] = spec;
  j["layout"] = {{"pp", pp}, {"dp", dp}, {"virtual_stages", virtual_stages}, {"partition", partition}};
  j["data"] = {{"samples_consumed", samples_consumed}};
  if (!tokens_by_source.empty()) {
    json& by_source = j["data"]["tokens_by_source"] = json::array();
    for (const auto& [name, tokens] : tokens_by_source) by_source.push_back({{"source", name}, {"tokens", tokens}});
  }
  j["optimizer"] = {{"steps", optimizer_steps}};
  // Nothing in a step draws random numbers at run time: init, synthetic data and shuffling are
  // counter-based functions of the seed, so the seed and the data position are the whole state.
  const auto seed = spec.find("run.seed");  // always there in what we write; informational only
  j["rng"] = {{"seed", seed == spec.end() ? "" : seed->second},
              {"kind", "counter-based, keyed by seed and sample index"}};
  json shards_json = json::array();
  for (auto& s : shards)
    shards_json.push_back(
        {{"file", s.file}, {"bytes", s.bytes}, {"checksum", hex16(s.checksum)}, {"tensors", s.tensors}});
  j["shards"] = shards_json;
  if (!tokenizer.file.empty())
    j["tokenizer"] = {{"kind", "sentencepiece"},
                      {"file", tokenizer.file},
                      {"bytes", tokenizer.bytes},
                      {"checksum", hex16(tokenizer.checksum)}};
  j["timing"] = {{"write_s", write_s}};
  if (!build.empty()) j["build"] = build;
  return j.dump(2) + "\n";
}

Manifest Manifest::read(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  return parse(read_input_file(path, "checkpoint manifest", 64 << 20), path);
}

namespace {

// The fields of a manifest's JSON; json::exception or std::logic_error (stoull) when one is
// missing or of the wrong kind.
Manifest from_json(const json& j) {
  Manifest m;
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
  if (j.at("data").contains("tokens_by_source"))
    for (const json& s : j.at("data").at("tokens_by_source"))
      m.tokens_by_source.emplace_back(s.at("source").get<std::string>(), s.at("tokens").get<int64_t>());
  // absent in checkpoints from before steps could be skipped: every step was an update then
  m.optimizer_steps = j.contains("optimizer") ? j.at("optimizer").at("steps").get<int64_t>() : m.step;
  for (auto& s : j.at("shards")) {
    Manifest::Shard sh;
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
  return m;
}

// What loading relies on; a hand-edited or damaged manifest must not send it elsewhere.
void check_fields(const Manifest& m, const std::string& path) {
  if (m.format != kCheckpointFormat)
    throw SpecError(path + ": checkpoint format " + std::to_string(m.format) + ", this pipetrain reads " +
                    std::to_string(kCheckpointFormat));
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
}

}  // namespace

Manifest Manifest::parse(const std::string& text, const std::string& path) {
  Manifest m;
  try {
    m = from_json(json::parse(text));
  } catch (const json::exception& e) {
    throw SpecError(path + ": not a valid pipetrain manifest (" + e.what() + ")");
  } catch (const std::logic_error& e) {  // stoull
    throw SpecError(path + ": not a valid pipetrain manifest (" + e.what() + ")");
  }
  check_fields(m, path);
  return m;
}

namespace {

// spec_of_checkpoint for a manifest already read from DIR.
RunSpec spec_of(const Manifest& m, const std::string& dir, const std::vector<std::string>& overrides, int world_size) {
  std::map<std::string, std::string> sections;  // section -> "key = value" lines
  for (const auto& [dotted, value] : m.spec) {
    const size_t dot = dotted.find('.');
    if (dot == std::string::npos) continue;
    sections[dotted.substr(0, dot)] += dotted.substr(dot + 1) + " = " + value + "\n";
  }
  std::string toml;
  for (const auto& [section, lines] : sections) toml += "[" + section + "]\n" + lines;
  const int world = std::max(1, world_size);
  std::vector<std::string> sets = {"parallel.tp=1",
                                   "parallel.sequence_parallel=false",
                                   "parallel.pp=1",
                                   "parallel.dp=" + std::to_string(world),
                                   "parallel.partition=uniform",
                                   "parallel.schedule=gpipe",
                                   "parallel.virtual_stages=1",
                                   "parallel.ep=1"};
  sets.insert(sets.end(), overrides.begin(), overrides.end());
  // dp fills the ranks the user's tp and pp leave (eval --set parallel.pp=2 on 4 ranks: dp 2),
  // unless they set dp too.
  try {
    const RunSpec asked = parse_spec(toml, dir + "/manifest.json", sets, kAnyLayout);
    const int cell = asked.parallel.tp * asked.parallel.pp;
    if (asked.parallel.dp == world && cell > 1 && world % cell == 0)
      sets.insert(sets.begin() + 4, "parallel.dp=" + std::to_string(world / cell));
  } catch (const SpecError&) {
  }  // the parse below says what is wrong
  return parse_spec(toml, dir + "/manifest.json", sets, world_size);
}

// What Manifest::parse cannot check alone: the step against its range and the directory's name,
// the partition against the model's depth.
std::string check_step_and_depth(const Manifest& m, const std::string& dir) {
  const std::string mpath = dir + "/manifest.json: ";
  const std::string dirname = fs::path(dir).filename().string();
  if (m.step < 1 || m.step > INT32_MAX) return mpath + "step " + std::to_string(m.step) + " is out of range";
  if (dirname.rfind("step_", 0) == 0 && dirname != checkpoint_name(m.step))
    return mpath + "step " + std::to_string(m.step) + " does not match the directory name " + dirname;
  int64_t blocks = 0;
  for (int b : m.partition) blocks += b;
  auto n_layer = m.spec.find("model.n_layer");
  if (n_layer == m.spec.end() || std::to_string(blocks) != n_layer->second)
    return mpath + "layout, partition and shard list do not agree";
  return "";
}

// The model the manifest's spec describes: every tensor it has listed in exactly one shard, at
// the shape each loader will ask for (into shape_of).
std::string check_tensor_lists(const Manifest& m, const std::string& dir,
                               std::map<std::string, std::vector<int>>& shape_of) {
  const std::string mpath = dir + "/manifest.json: ";
  try {
    const RunSpec spec = spec_of(m, dir, {}, 1);
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
  return "";
}

// One shard file against its manifest entry: size, checksum, step, and exactly the listed tensors.
std::string check_shard_file(const std::string& dir, const Manifest& m, const Manifest::Shard& s,
                             std::map<std::string, std::vector<int>>& shape_of) {
  const std::string path = dir + "/" + s.file;
  uint64_t bytes = 0, sum = 0;
  try {
    sum = file_checksum(path, &bytes);
    if (bytes != s.bytes)
      return path + ": " + std::to_string(bytes) + " bytes, the manifest says " + std::to_string(s.bytes) +
             " (truncated or replaced)";
    if (sum != s.checksum)
      return path + ": checksum " + hex16(sum) + " differs from the manifest's " + hex16(s.checksum) + " (corrupted)";
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
  return "";
}

std::string check_tokenizer_file(const std::string& dir, const Manifest& m) {
  const std::string path = dir + "/" + m.tokenizer.file;
  uint64_t bytes = 0, sum = 0;
  try {
    sum = file_checksum(path, &bytes);
  } catch (const std::exception& e) {
    return e.what();
  }
  if (bytes != m.tokenizer.bytes || sum != m.tokenizer.checksum)
    return path + ": " + std::to_string(bytes) + " bytes, checksum " + hex16(sum) + "; the manifest says " +
           std::to_string(m.tokenizer.bytes) + " bytes, checksum " + hex16(m.tokenizer.checksum) + " (corrupted)";
  return "";
}

}  // namespace

std::string verify_checkpoint(const std::string& dir, int part, int parts) {
  Manifest m;
  try {
    m = Manifest::read(dir);  // the layout's own consistency is checked there
  } catch (const SpecError& e) {
    return e.what();
  }
  if (std::string why = check_step_and_depth(m, dir); !why.empty()) return why;
  std::map<std::string, std::vector<int>> shape_of;
  if (std::string why = check_tensor_lists(m, dir, shape_of); !why.empty()) return why;
  for (size_t i = 0; i < m.shards.size(); ++i)
    if (static_cast<int>(i % parts) == part)
      if (std::string why = check_shard_file(dir, m, m.shards[i], shape_of); !why.empty()) return why;
  if (part == 0 && !m.tokenizer.file.empty()) return check_tokenizer_file(dir, m);
  return "";
}

RunSpec spec_of_checkpoint(const std::string& dir, const std::vector<std::string>& overrides, int world_size) {
  return spec_of(Manifest::read(dir), dir, overrides, world_size);
}

}  // namespace pipetrain
