#include "pipetrain/config/spec.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>

#include "pipetrain/config/other_names.hpp"
#include "pipetrain/config/spec_schema.hpp"
#include "pipetrain/util/files.hpp"

namespace pipetrain {
namespace {

std::string where_in_file(const std::string& file, const toml::node& n) {
  return file + ":" + std::to_string(n.source().begin.line);
}

// "section.key=value": the value is read as TOML (numbers, booleans, lists, quoted strings) and
// falls back to a plain string, so `--set run.name=foo` works without quotes.
void apply_override(toml::table& root, const std::string& text,
                    std::vector<std::pair<std::string, std::string>>& set_by_cli) {
  auto eq = text.find('=');
  auto dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq || dot == 0 || dot + 1 == eq)
    throw SpecError("--set " + text + ": expected section.key=value (e.g. --set parallel.pp=2)");
  std::string section = text.substr(0, dot), key = text.substr(dot + 1, eq - dot - 1);
  std::string value = text.substr(eq + 1);
  toml::table parsed;
  const SpecKey* known = find_spec_key(section + "." + key);
  try {
    parsed = toml::parse("v = " + value);
    if (known && known->takes_string && !parsed.get("v")->is_string()) parsed.insert_or_assign("v", value);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", value);
  }
  // A key of a subtable (model.moe.experts) goes where TOML's [model.moe] would put it.
  toml::table* table = &root;
  std::string rest = section + "." + key;
  for (size_t dot_at; (dot_at = rest.find('.')) != std::string::npos; rest.erase(0, dot_at + 1)) {
    const std::string part = rest.substr(0, dot_at);
    if (!table->contains(part) || !(*table)[part].is_table()) table->insert_or_assign(part, toml::table{});
    table = (*table)[part].as_table();
  }
  table->insert_or_assign(rest, *parsed.get("v"));
  set_by_cli.emplace_back(section + "." + key, "--set " + text);
}

// Keys pipetrain once read and no longer does, with why. Specs and run directories written before
// still hold them (config.toml, a checkpoint's manifest), so they are skipped with a note, not refused.
const char* retired_because(const std::string& dotted) {
  static const std::pair<const char*, const char*> kRetired[] = {
      {"comm.backend", "ranks always exchange data over MPI (a GPU build through host copies)"},
  };
  for (auto& [key, why] : kRetired)
    if (dotted == key) return why;
  return nullptr;
}

// A section's keys with their values, a subtable's ([model.moe], or moe.experts = 8 under
// [model]) named by its dotted path: "moe.experts".
std::vector<std::pair<std::string, const toml::node*>> keys_of(const toml::table& section) {
  std::vector<std::pair<std::string, const toml::node*>> keys;
  for (auto& [name, node] : section) {
    const std::string key(name.str());
    if (!node.is_table()) {
      keys.emplace_back(key, &node);
      continue;
    }
    for (auto& [sub, value] : keys_of(*node.as_table())) keys.emplace_back(key + "." + sub, value);
  }
  return keys;
}

std::string origin_of(const std::vector<std::pair<std::string, std::string>>& origins, const std::string& key) {
  for (auto it = origins.rbegin(); it != origins.rend(); ++it)
    if (it->first == key) return it->second;
  return "";
}

// The llama family's defaults that follow from other keys, filled in once, so that config.toml and
// every later reader hold the values the model is built with.
void resolve_model_defaults(RunSpec& spec) {
  auto& m = spec.model;
  if (m.arch != Arch::llama) return;
  if (origin_of(spec.origins, "model.tie_embeddings").empty()) m.tie_embeddings = false;
  if (m.n_kv_head == 0) m.n_kv_head = m.n_head;
  if (m.ffn_hidden == 0) m.ffn_hidden = llama_ffn_hidden(m.d_model, m.ffn_multiple_of);
  if (m.moe.on() && m.moe.ffn_hidden == 0) m.moe.ffn_hidden = m.ffn_hidden;
}

// A mixture of experts' keys: experts in the llama family, a top_k they can serve, an MoE block
// somewhere, widths the tensor ranks split evenly; the other moe keys only with experts.
void validate_moe(const RunSpec& s, const std::function<void(const std::string&, const std::string&)>& fail) {
  const auto& m = s.model;
  const auto& moe = m.moe;
  if (!moe.on()) {
    if (s.parallel.ep > 1)
      fail("parallel.ep",
           "ep = " + std::to_string(s.parallel.ep) + " spreads experts, and model.moe.experts = 0 (a dense model)");
    const RunSpec::Model::Moe d;
    const std::pair<const char*, bool> moe_only[] = {
        {"model.moe.top_k", moe.top_k != d.top_k},
        {"model.moe.ffn_hidden", moe.ffn_hidden != d.ffn_hidden},
        {"model.moe.shared_experts", moe.shared_experts != d.shared_experts},
        {"model.moe.shared_ffn_hidden", moe.shared_ffn_hidden != d.shared_ffn_hidden},
        {"model.moe.shared_gate", moe.shared_gate != d.shared_gate},
        {"model.moe.norm_topk", moe.norm_topk != d.norm_topk},
        {"model.moe.every", moe.every != d.every},
        {"model.moe.capacity_factor", moe.capacity_factor != d.capacity_factor},
        {"model.moe.aux_loss", moe.aux_loss != d.aux_loss},
        {"model.moe.z_loss", moe.z_loss != d.z_loss}};
    for (const auto& [key, set] : moe_only)
      if (set) fail(key, "belongs to a mixture of experts, and model.moe.experts = 0 (a dense model)");
    return;
  }
  if (m.arch != Arch::llama)
    fail("model.moe.experts", "experts are SwiGLU MLPs of the llama family: they need model.arch = \"llama\"");
  if (moe.top_k > moe.experts)
    fail("model.moe.top_k", "top_k = " + std::to_string(moe.top_k) + " exceeds model.moe.experts = " +
                                std::to_string(moe.experts) + " (each token goes to top_k different experts)");
  if (moe.every > m.n_layer)
    fail("model.moe.every", "every = " + std::to_string(moe.every) +
                                " makes none of model.n_layer = " + std::to_string(m.n_layer) +
                                " blocks an MoE block (block i is one when (i + 1) % every = 0)");
  for (const auto& [key, set] : {std::pair<const char*, bool>{"model.moe.shared_ffn_hidden", moe.shared_ffn_hidden > 0},
                                 {"model.moe.shared_gate", moe.shared_gate}})
    if (set && moe.shared_experts == 0) fail(key, "belongs to the shared experts, and model.moe.shared_experts = 0");
  const int ep = s.parallel.ep;
  if (moe.experts % ep != 0)
    fail("parallel.ep", "ep = " + std::to_string(ep) + " does not divide model.moe.experts = " +
                            std::to_string(moe.experts) + " (each expert-parallel rank holds experts / ep of them)");
  if (s.parallel.dp % ep != 0)
    fail("parallel.ep", "ep = " + std::to_string(ep) + " does not divide parallel.dp = " +
                            std::to_string(s.parallel.dp) + " (the expert-parallel ranks are data-parallel replicas)");
  const int tp = s.parallel.tp;
  const int ffn = moe.ffn_hidden > 0 ? moe.ffn_hidden : m.ffn_hidden;
  if (ffn > 0 && ffn % tp != 0)
    fail("parallel.tp", "tp = " + std::to_string(tp) + " does not divide each expert's SwiGLU width " +
                            std::to_string(ffn) + " (model.moe.ffn_hidden; each tensor rank holds ffn / tp of it)");
  if (moe.shared_ffn_hidden % tp != 0)
    fail("parallel.tp", "tp = " + std::to_string(tp) + " does not divide the shared experts' SwiGLU width " +
                            std::to_string(moe.shared_ffn_hidden) + " (model.moe.shared_ffn_hidden)");
}

// What a model spec cannot be: keys of the other family, and shapes the llama block cannot take.
void validate_model(const RunSpec& s, const std::function<void(const std::string&, const std::string&)>& fail) {
  const auto& m = s.model;
  if (m.arch == Arch::gpt2) {
    const RunSpec::Model d;
    const std::pair<const char*, bool> llama_only[] = {
        {"model.n_kv_head", m.n_kv_head != d.n_kv_head},
        {"model.rope_theta", m.rope_theta != d.rope_theta},
        {"model.ffn_hidden", m.ffn_hidden != d.ffn_hidden},
        {"model.ffn_multiple_of", m.ffn_multiple_of != d.ffn_multiple_of},
        {"model.norm_eps", m.norm_eps != d.norm_eps},
        {"model.attention_bias", m.attention_bias != d.attention_bias},
        {"model.qk_norm", m.qk_norm != d.qk_norm}};
    for (const auto& [key, set] : llama_only)
      if (set) fail(key, "belongs to model.arch = \"llama\"; this spec's model.arch is \"gpt2\"");
    return;
  }
  if (m.n_kv_head > m.n_head || m.n_head % m.n_kv_head != 0)
    fail("model.n_kv_head", "n_kv_head = " + std::to_string(m.n_kv_head) +
                                " does not divide model.n_head = " + std::to_string(m.n_head) +
                                " (each key/value head serves n_head / n_kv_head query heads)");
  if (m.d_model % m.n_head == 0 && (m.d_model / m.n_head) % 2 != 0)
    fail("model.n_head", "head_dim = d_model / n_head = " + std::to_string(m.d_model / m.n_head) +
                             " is odd: rotary position embeddings rotate pairs of dimensions");
}

// The data keys: a source and its path, held-out data for validation, document masking.
void validate_data(const RunSpec& s, const std::function<void(const std::string&, const std::string&)>& fail) {
  const auto& m = s.model;
  if (s.eval.every_steps > 0 && s.data.source == DataSource::text)
    fail("eval.every_steps",
         "validation needs held-out data: a token file with /val (pipetrain data prepare, "
         "data.source = \"hdf5\") or data.source = \"synthetic\"");
  if (!s.data.sources.empty() && s.data.source != DataSource::hdf5)
    fail("data.source", std::string("data.source = \"") + name_of(s.data.source) +
                            "\" but data.sources lists token files (data.source = \"hdf5\", or leave it unset)");
  if (!s.data.sources.empty() && !s.data.path.empty())
    fail("data.path",
         "data.path and data.sources both given: a single token file is one source (drop data.path, "
         "or list it in data.sources)");
  if (s.data.source != DataSource::synthetic && s.data.path.empty() && s.data.sources.empty())
    fail("data.path", std::string("data.source = \"") + name_of(s.data.source) + "\" needs data.path" +
                          (s.data.source == DataSource::hdf5 ? " (or data.sources)" : ""));
  if (s.data.restart_positions && !s.data.document_mask)
    fail("data.restart_positions", "restarts positions at each document: it needs data.document_mask = true");
  if (s.data.document_mask && s.data.document_token >= m.vocab)
    fail("data.document_token", "document_token = " + std::to_string(s.data.document_token) +
                                    " is not a token of model.vocab = " + std::to_string(m.vocab));
  if (s.data.document_mask && s.data.document_token < 0 && s.data.source != DataSource::hdf5)
    fail("data.document_token",
         std::string("the byte tokens of data.source = \"") + name_of(s.data.source) +
             "\" have no end-of-document token: name the token that begins a document (10, a newline, makes each "
             "line one)");
  if (s.data.source == DataSource::text && m.vocab < 256)
    fail("model.vocab", "vocab = " + std::to_string(m.vocab) +
                            " is too small for byte tokens of data.source = \"text\" (need >= 256)");
  if (s.data.source == DataSource::synthetic && m.vocab < 128)
    fail("model.vocab",
         "vocab = " + std::to_string(m.vocab) + " is too small for the synthetic byte language (need >= 128)");
}

// Every width parallel.tp splits must divide evenly: query heads, key/value heads, the MLP's hidden
// width. The vocabulary need not (its rows are split as evenly as they go).
void validate_tensor_parallel(const RunSpec& s,
                              const std::function<void(const std::string&, const std::string&)>& fail) {
  const auto& m = s.model;
  const int tp = s.parallel.tp;
  if (tp == 1 && s.parallel.sequence_parallel)
    fail("parallel.sequence_parallel", "splits tokens among tensor ranks: it needs parallel.tp > 1");
  if (tp == 1) return;
  const std::string tp_is = "tp = " + std::to_string(tp);
  const int64_t tokens = int64_t{s.samples_per_micro_batch()} * m.seq_len;
  if (s.parallel.sequence_parallel && s.parallel.micro_batches > 0 && s.parallel.dp > 0 && tokens % tp != 0)
    fail("parallel.sequence_parallel", "a micro-batch's " + std::to_string(tokens) +
                                           " tokens (samples x model.seq_len) do not split among " + tp_is +
                                           " tensor ranks");
  if (m.n_head % tp != 0)
    fail("parallel.tp", tp_is + " does not divide model.n_head = " + std::to_string(m.n_head) +
                            " (each tensor rank holds n_head / tp attention heads)");
  if (m.vocab < tp) fail("parallel.tp", tp_is + " exceeds model.vocab = " + std::to_string(m.vocab));
  if (m.arch != Arch::llama) return;
  const int kv_heads = m.n_kv_head > 0 ? m.n_kv_head : m.n_head;
  if (kv_heads % tp != 0 && tp % kv_heads != 0)
    fail("parallel.tp", tp_is + " neither divides model.n_kv_head = " + std::to_string(kv_heads) +
                            " nor is a multiple of it (each tensor rank holds n_kv_head / tp key/value heads, or "
                            "tp / n_kv_head ranks hold the same one)");
  const int ffn = m.ffn_hidden > 0 ? m.ffn_hidden : llama_ffn_hidden(m.d_model, m.ffn_multiple_of);
  if (ffn % tp != 0)
    fail("parallel.tp", tp_is + " does not divide the MLP's hidden width " + std::to_string(ffn) +
                            " (model.ffn_hidden; each tensor rank holds ffn / tp of it)");
}

// Did-you-mean for an unknown key: the same key name in another section first (a key put under
// the wrong header), then the key another trainer's name means, else the nearest section.key by
// edit distance, only when it is near for the key's own name (a long name of another trainer's
// would otherwise land on any key of a similar length and another meaning).
// Returns the hint's words ("did you mean train.lr?"), or "" when there is none to give.
std::string suggest_key(const std::string& full, const std::string& key_name, const std::vector<std::string>& dotted) {
  for (auto& d : dotted)
    if (d.substr(d.find('.') + 1) == key_name) return "did you mean " + d + "?";
  for (auto& d : dotted)  // a subtable's key put in its section: [model] experts = 8
    if (d.substr(d.rfind('.') + 1) == key_name) return "did you mean " + d + "?";
  if (const OtherName* other = other_trainers_name(key_name)) {
    if (!*other->ours) return "pipetrain has no such key: " + std::string(other->note);
    return "did you mean " + std::string(other->ours) + (*other->note ? ": " + std::string(other->note) : "") + "?";
  }
  const std::string near = closest_match(full, dotted, std::max<size_t>(2, key_name.size() / 4));
  return near.empty() ? "" : "did you mean " + near + "?";
}

// parallel.dp left unset takes the ranks tp × pp leave (mpiexec -n 4 with pp 2: dp 2), as eval and
// the job script do; a count tp × pp does not divide is refused here with that arithmetic, and an
// explicit dp is only checked, by validate_spec.
void fill_data_parallel(RunSpec& spec, int world_size, const std::string& ranks_are) {
  if (!origin_of(spec.origins, "parallel.dp").empty()) return;
  auto& p = spec.parallel;
  const int64_t cell = int64_t{p.tp} * p.pp;
  if (world_size % cell != 0) {
    const std::string key = p.tp > 1 ? "parallel.tp" : "parallel.pp";
    const std::string grid =
        p.tp > 1 ? "tp " + std::to_string(p.tp) + " x pp " + std::to_string(p.pp) + " = " + std::to_string(cell)
                 : "pp " + std::to_string(p.pp);
    throw SpecError(spec.origin(key) + ": " + key + ": " + std::to_string(world_size) + " " + ranks_are + " but " +
                    grid + " does not divide them (parallel.dp, unset, takes the ranks tp x pp leave)");
  }
  p.dp = static_cast<int>(world_size / cell);
  spec.origins.emplace_back("parallel.dp", "(" + std::to_string(world_size) + " ranks / tp x pp)");
}

// An implied key sets what neither the file nor an override set; its origin says where it came from.
void apply_implied(RunSpec& spec, const ImpliedKey& k) {
  if (!origin_of(spec.origins, k.key).empty()) return;
  const SpecKey* it = find_spec_key(k.key);
  if (!it) throw std::logic_error("implied key " + k.key + " is not a spec key");
  const toml::table parsed = toml::parse("v = " + k.value);
  it->set(spec, *parsed.get("v"), k.from);
  spec.origins.emplace_back(k.key, k.from);
}

}  // namespace

std::string RunSpec::origin(const std::string& dotted_key) const {
  std::string o = origin_of(origins, dotted_key);
  return o.empty() ? "(default)" : o;
}

RunSpec load_spec(const std::string& path, const std::vector<std::string>& overrides, int world_size,
                  const SpecContext& context) {
  // a run spec is a few KiB
  return parse_spec(path.empty() ? "" : read_input_file(path, "spec file", 1 << 20), path, overrides, world_size,
                    context);
}

RunSpec parse_spec(const std::string& text, const std::string& path, const std::vector<std::string>& overrides,
                   int world_size, const SpecContext& context) {
  toml::table root;
  if (!path.empty()) {
    try {
      root = toml::parse(text, path);
    } catch (const toml::parse_error& e) {
      throw SpecError(path + ":" + std::to_string(e.source().begin.line) +
                      ": not valid TOML: " + std::string(e.description()));
    }
  }
  std::vector<std::pair<std::string, std::string>> set_by_cli;
  for (auto& o : overrides) apply_override(root, o, set_by_cli);

  const auto& schema = spec_schema();
  std::vector<std::string> sections, dotted;
  for (auto& k : schema) {
    if (sections.empty() || sections.back() != k.section) sections.push_back(k.section);
    dotted.push_back(k.dotted());
  }

  RunSpec spec;
  for (auto& [sec_name, sec_node] : root) {
    std::string sec(sec_name.str());
    std::string where = origin_of(set_by_cli, sec);
    if (!sec_node.is_table()) {
      std::string at = path.empty() ? "--set" : where_in_file(path, sec_node);
      std::string hint = suggest_key(sec, sec, dotted);
      throw SpecError(at + ": '" + sec + "' must be a [section] (keys go inside sections" +
                      (hint.empty() ? "" : "; " + hint) + ")");
    }
    if (std::find(sections.begin(), sections.end(), sec) == sections.end()) {
      std::string at = path.empty() ? "--set" : path + ":" + std::to_string(sec_node.source().begin.line);
      for (auto& [k, v] : *sec_node.as_table()) {
        std::string cli = origin_of(set_by_cli, sec + "." + std::string(k.str()));
        if (!cli.empty()) at = cli;
        (void)v;
      }
      std::string hint = closest_match(sec, sections);
      throw SpecError(at + ": unknown section [" + sec + "]" + (hint.empty() ? "" : " (did you mean [" + hint + "]?)"));
    }
    for (auto& [key_name, node] : keys_of(*sec_node.as_table())) {
      std::string full = sec + "." + key_name;
      std::string at = origin_of(set_by_cli, full);
      if (at.empty()) at = where_in_file(path, *node);
      if (const char* why = retired_because(full)) {
        spec.notes.push_back(at + ": " + full + " is no longer read (" + why + "); it can be deleted");
        continue;
      }
      const SpecKey* it = find_spec_key(full);
      if (!it) {
        // Suggest across sections too: `[train] micro_batches` should point at parallel.micro_batches.
        std::string hint = suggest_key(full, key_name, dotted);
        throw SpecError(at + ": unknown key " + full + (hint.empty() ? "" : " (" + hint + ")"));
      }
      it->set(spec, *node, at);
      spec.origins.emplace_back(full, at);
    }
  }
  for (const ImpliedKey& k : context.implied) apply_implied(spec, k);
  // Sources are token files: they make data.source hdf5 unless it was set where they were (a file
  // that says both is refused by validate_spec), so --set data.sources=... overrides a config's source.
  const std::string source_at = origin_of(spec.origins, "data.source"),
                    sources_at = origin_of(spec.origins, "data.sources");
  const auto on_command_line = [](const std::string& at) { return at.rfind("--set", 0) == 0; };
  if (!spec.data.sources.empty() &&
      (source_at.empty() || (on_command_line(sources_at) && !on_command_line(source_at)))) {
    spec.data.source = DataSource::hdf5;
    spec.origins.emplace_back("data.source", sources_at);
  }
  // A schedule that always runs the same chunk count implies it: virtual_stages defaults to it
  // (an explicit value that contradicts it is still refused, by the schedule's check).
  resolve_model_defaults(spec);
  if (spec.parallel.schedule->implied_chunks > 0 && origin_of(spec.origins, "parallel.virtual_stages").empty()) {
    spec.parallel.virtual_stages = spec.parallel.schedule->implied_chunks;
    spec.origins.emplace_back("parallel.virtual_stages", origin_of(spec.origins, "parallel.schedule"));
  }
  if (world_size == kUnchecked) return spec;
  if (world_size > 0) fill_data_parallel(spec, world_size, context.ranks_are);
  if (world_size != kAnyLayout) {
    validate_spec(spec, world_size, context.ranks_are);
    return spec;
  }
  RunSpec one_rank = spec;  // the model, data and training keys, on a layout that fits any of them
  auto& p = one_rank.parallel;
  p.tp = p.pp = p.dp = p.virtual_stages = p.ep = 1;
  p.sequence_parallel = false;
  p.micro_batches = spec.train.global_batch > 0 ? spec.train.global_batch : 1;
  p.schedule = &schedule_named("gpipe");
  p.partition = Partition::uniform;
  p.blocks_per_stage.clear();
  validate_spec(one_rank, 0);
  return spec;
}

void validate_spec(const RunSpec& s, int world_size, const std::string& ranks_are) {
  auto fail = [&](const std::string& key, const std::string& msg) {
    throw SpecError(s.origin(key) + ": " + key + ": " + msg);
  };
  const auto& m = s.model;
  const auto& p = s.parallel;
  // 64-bit products: each factor is range-checked, their product may still exceed int.
  const int64_t ranks = int64_t{p.tp} * p.pp * p.dp, batch_divisor = int64_t{p.dp} * p.micro_batches;
  if (p.schedule->splits_backward && p.recompute != Recompute::none)
    fail("parallel.recompute", std::string("recompute = ") + name_of(p.recompute) +
                                   " cannot be used with parallel.schedule = " + p.schedule->name +
                                   " (its weight-gradient passes need the activations kept; use recompute = none)");
  if (m.d_model % m.n_head != 0)
    fail("model.n_head",
         "n_head = " + std::to_string(m.n_head) + " does not divide model.d_model = " + std::to_string(m.d_model));
  validate_model(s, fail);
  validate_moe(s, fail);
  validate_tensor_parallel(s, fail);
  if (world_size > 0 && ranks != world_size)
    fail(p.tp > 1 ? "parallel.tp" : "parallel.pp",
         std::string(p.tp > 1 ? "tp x pp x dp = " + std::to_string(p.tp) + " x " : "pp x dp = ") +
             std::to_string(p.pp) + " x " + std::to_string(p.dp) + " = " + std::to_string(ranks) + " but " +
             std::to_string(world_size) + " " + ranks_are);
  if (const LayoutProblem problem = layout_problem(*p.schedule, s.pipeline_shape())) fail(problem.key, problem.why);
  const int64_t chunks = int64_t{p.pp} * p.virtual_stages;
  if (s.train.global_batch % batch_divisor != 0)
    fail("train.global_batch",
         "global_batch = " + std::to_string(s.train.global_batch) +
             " is not divisible by parallel.dp x parallel.micro_batches = " + std::to_string(batch_divisor));
  if (p.partition == Partition::explicit_list) {
    long total = 0;
    for (int b : p.blocks_per_stage) total += b;
    if (static_cast<int64_t>(p.blocks_per_stage.size()) != chunks)
      fail("parallel.partition", "lists " + std::to_string(p.blocks_per_stage.size()) +
                                     " stages but parallel.pp = " + std::to_string(p.pp) +
                                     (p.virtual_stages > 1 ? " x virtual_stages = " + std::to_string(chunks) : ""));
    if (total != m.n_layer)
      fail("parallel.partition",
           "assigns " + std::to_string(total) + " blocks but model.n_layer = " + std::to_string(m.n_layer));
  }
  if (s.log.straggler_ratio > 0 && s.log.straggler_ratio <= 1)
    fail("log.straggler_ratio",
         "straggler_ratio = " + (std::ostringstream() << s.log.straggler_ratio).str() +
             " would call every rank a straggler: use a factor above 1 (e.g. 1.25), or 0 for no detection");
  if (s.log.straggler_action != StragglerAction::log && s.log.straggler_ratio == 0)
    fail("log.straggler_action", std::string("straggler_action = \"") + name_of(s.log.straggler_action) +
                                     "\" acts on the stragglers detection finds, and log.straggler_ratio = 0 turns "
                                     "detection off: set a ratio above 1 (e.g. 1.25)");
  if (s.train.min_lr > s.train.lr) fail("train.min_lr", "min_lr must not exceed train.lr");
  validate_data(s, fail);
  // Buffers are indexed with int in BLAS and MPI counts: keep every per-micro-batch tensor below 2^31
  // (attention keeps no T x T matrix: its largest buffers are the projections').
  const int64_t tokens = int64_t{s.train.global_batch} / batch_divisor * m.seq_len;
  const int64_t largest = std::max({tokens * 4 * m.d_model, tokens * 2 * m.ffn_hidden, tokens * m.vocab});
  if (largest > INT32_MAX)
    fail("model.seq_len", "a micro-batch tensor would hold " + std::to_string(largest) +
                              " elements (limit 2^31-1): lower seq_len, d_model, vocab or the micro-batch size");
  if (s.run.out_dir.empty()) fail("run.out_dir", "must not be empty (use \".\" for the current folder)");
  if (s.run.name.empty() || s.run.name.find('/') != std::string::npos)
    fail("run.name", "must be a non-empty name without '/'");
}

std::string tensor_parallel_problem(const RunSpec& spec) {
  try {
    validate_tensor_parallel(spec,
                             [](const std::string& key, const std::string& msg) { throw SpecError(key + ": " + msg); });
  } catch (const SpecError& e) {
    return e.what();
  }
  return "";
}

std::string grid_text(int tp, int pp, int dp) {
  return (tp > 1 ? "tp " + std::to_string(tp) + " x " : std::string()) + "pp " + std::to_string(pp) + " x dp " +
         std::to_string(dp);
}

int llama_ffn_hidden(int d_model, int multiple_of) {
  const int64_t two_thirds = int64_t{8} * d_model / 3;  // 2/3 of 4 d_model, rounded down
  return static_cast<int>((two_thirds + multiple_of - 1) / multiple_of * multiple_of);
}

StepShape step_shape(const RunSpec& spec) {
  const auto& p = spec.parallel;
  return {p.pp,
          p.dp,
          p.micro_batches,
          p.virtual_stages,
          spec.samples_per_micro_batch(),
          spec.model.seq_len,
          spec.model.d_model,
          p.schedule->placement};
}

std::string resolved_toml(const RunSpec& spec) {
  std::ostringstream os;
  os << "# resolved pipetrain run spec: every key, defaults filled in\n";
  std::string section;
  for (auto& k : spec_schema()) {
    if (k.section != section) {
      section = k.section;
      os << "\n[" << section << "]\n";
    }
    os << k.key << " = " << k.show(spec) << "  # " << k.doc << "\n";
  }
  return os.str();
}

uint64_t spec_hash(const RunSpec& spec) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the resolved text
  for (unsigned char c : resolved_toml(spec)) h = (h ^ c) * 1099511628211ULL;
  return h;
}

std::string spec_reference_markdown() {
  RunSpec defaults;
  std::ostringstream os;
  os << "| key | default | meaning |\n|---|---|---|\n";
  for (auto& k : spec_schema()) os << "| `" << k.dotted() << "` | `" << k.show(defaults) << "` | " << k.doc << " |\n";
  return os.str();
}

}  // namespace pipetrain
