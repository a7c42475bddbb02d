#include "pipetrain/config/spec_schema.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <sstream>

namespace pipetrain {
namespace {

std::string describe(const toml::node& n) {
  std::ostringstream os;
  switch (n.type()) {
    case toml::node_type::string:
      os << "string ";
      break;
    case toml::node_type::integer:
      os << "integer ";
      break;
    case toml::node_type::floating_point:
      os << "float ";
      break;
    case toml::node_type::boolean:
      os << "boolean ";
      break;
    case toml::node_type::array:
      os << "array ";
      break;
    case toml::node_type::table:
      return "a table";
    default:
      os << "date/time ";
      break;
  }
  n.visit([&](auto&& v) { os << v; });
  return os.str();
}

[[noreturn]] void type_error(const std::string& where, const std::string& key, const char* want, const toml::node& n) {
  throw SpecError(where + ": " + key + " must be " + want + ", got " + describe(n));
}

std::string show_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // stays a TOML float
  return s;
}

// A source's default name: "data/web.h5", "data/web/", "shards/web_*.h5" and "data/web/*.h5" -> "web".
std::string source_name_from(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  auto last_part = [](const std::string& p) { return p.substr(p.find_last_of('/') + 1); };
  std::string name = last_part(path);
  if (const size_t wild = name.find_first_of("*?["); wild != std::string::npos) {  // a glob: what precedes it
    name.resize(wild);
    while (!name.empty() && (name.back() == '_' || name.back() == '-' || name.back() == '.')) name.pop_back();
    const size_t slash = path.find_last_of('/');
    if (name.empty() && slash != std::string::npos) name = last_part(path.substr(0, slash));  // else its folder
  }
  const size_t dot = name.find('.');
  if (dot != std::string::npos && dot > 0) name.resize(dot);
  return name.empty() ? "source" : name;
}

std::string show_string(const std::string& v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {  // TOML forbids raw control chars
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += c;
  }
  return out + "\"";
}

// Accessors to one spec field. `show` calls them on a const spec through const_cast: they only
// return a reference, and show only reads through it.
using IntRef = std::function<int&(RunSpec&)>;
using DoubleRef = std::function<double&(RunSpec&)>;
using StringRef = std::function<std::string&(RunSpec&)>;
using BoolRef = std::function<bool&(RunSpec&)>;

SpecKey int_key(const char* sec, const char* key, IntRef ref, long long lo, long long hi, const char* doc) {
  SpecKey k{sec, key, doc, nullptr, nullptr};
  std::string dotted = k.dotted();
  k.set = [=](RunSpec& s, const toml::node& n, const std::string& where) {
    if (!n.is_integer()) type_error(where, dotted, "an integer", n);
    long long v = n.as_integer()->get();
    if (v < lo || v > hi)
      throw SpecError(where + ": " + dotted + " = " + std::to_string(v) + " is out of range [" + std::to_string(lo) +
                      ", " + std::to_string(hi) + "]");
    ref(s) = static_cast<int>(v);
  };
  k.show = [=](const RunSpec& s) { return std::to_string(ref(const_cast<RunSpec&>(s))); };
  return k;
}

SpecKey seed_key() {
  SpecKey k{"run", "seed", "seeds parameter init, synthetic data and shuffling", nullptr, nullptr};
  k.set = [](RunSpec& s, const toml::node& n, const std::string& where) {
    if (!n.is_integer()) type_error(where, "run.seed", "an integer", n);
    long long v = n.as_integer()->get();
    if (v < 0) throw SpecError(where + ": run.seed = " + std::to_string(v) + " must be >= 0");
    s.run.seed = v;
  };
  k.show = [](const RunSpec& s) { return std::to_string(s.run.seed); };
  return k;
}

SpecKey double_key(const char* sec, const char* key, DoubleRef ref, double lo, double hi, const char* doc) {
  SpecKey k{sec, key, doc, nullptr, nullptr};
  std::string dotted = k.dotted();
  k.set = [=](RunSpec& s, const toml::node& n, const std::string& where) {
    double v;
    if (n.is_floating_point()) v = n.as_floating_point()->get();
    else if (n.is_integer()) v = static_cast<double>(n.as_integer()->get());
    else type_error(where, dotted, "a number", n);
    if (!(v >= lo && v <= hi))
      throw SpecError(where + ": " + dotted + " = " + show_double(v) + " is out of range [" + show_double(lo) + ", " +
                      show_double(hi) + "]");
    ref(s) = v;
  };
  k.show = [=](const RunSpec& s) { return show_double(ref(const_cast<RunSpec&>(s))); };
  return k;
}

SpecKey bool_key(const char* sec, const char* key, BoolRef ref, const char* doc) {
  SpecKey k{sec, key, doc, nullptr, nullptr};
  std::string dotted = k.dotted();
  k.set = [=](RunSpec& s, const toml::node& n, const std::string& where) {
    if (!n.is_boolean()) type_error(where, dotted, "true or false", n);
    ref(s) = n.as_boolean()->get();
  };
  k.show = [=](const RunSpec& s) { return ref(const_cast<RunSpec&>(s)) ? "true" : "false"; };
  return k;
}

// parallel.reshard_after_forward: a boolean whose default follows parallel.pp.
SpecKey reshard_key() {
  SpecKey k{"parallel", "reshard_after_forward",
            "zero = 3: free a layer's gathered weights after each forward and gather them again for its "
            "backward (unset: true under pp 1; false under pp > 1, where a step's micro-batches share "
            "one gather of each layer, held from its first forward to its last backward)",
            nullptr, nullptr};
  k.set = [](RunSpec& s, const toml::node& n, const std::string& where) {
    if (!n.is_boolean()) type_error(where, "parallel.reshard_after_forward", "true or false", n);
    s.parallel.reshard_after_forward = n.as_boolean()->get() ? 1 : 0;
  };
  k.show = [](const RunSpec& s) { return s.parallel.reshards_after_forward() ? "true" : "false"; };
  return k;
}

// A free string (names and paths).
SpecKey string_key(const char* sec, const char* key, StringRef ref, const char* doc) {
  SpecKey k{sec, key, doc, nullptr, nullptr};
  k.takes_string = true;
  std::string dotted = k.dotted();
  k.set = [=](RunSpec& s, const toml::node& n, const std::string& where) {
    if (!n.is_string()) type_error(where, dotted, "a string", n);
    ref(s) = n.as_string()->get();
  };
  k.show = [=](const RunSpec& s) { return show_string(ref(const_cast<RunSpec&>(s))); };
  return k;
}

[[noreturn]] void not_a_choice(const std::string& where, const std::string& dotted, const std::string& value,
                               const std::vector<std::string>& names) {
  std::string all;
  for (auto& c : names) all += (all.empty() ? "" : " | ") + c;
  const std::string hint = closest_match(value, names);
  throw SpecError(where + ": " + dotted + " = \"" + value + "\" is not one of " + all +
                  (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
}

// One of an enum's spellings (config/choices.hpp).
template <class E>
SpecKey choice_key(const char* sec, const char* key, std::function<E&(RunSpec&)> ref, const char* doc) {
  SpecKey k{sec, key, doc, nullptr, nullptr};
  k.takes_string = true;
  std::string dotted = k.dotted();
  k.set = [=](RunSpec& s, const toml::node& n, const std::string& where) {
    if (!n.is_string()) type_error(where, dotted, "a string", n);
    const std::string v = n.as_string()->get();
    const std::optional<E> value = choice_named<E>(v);
    if (!value) not_a_choice(where, dotted, v, {Choices<E>::names.begin(), Choices<E>::names.end()});
    ref(s) = *value;
  };
  k.show = [=](const RunSpec& s) { return show_string(name_of(ref(const_cast<RunSpec&>(s)))); };
  return k;
}

// parallel.schedule: a name in the schedule registry, looked up when the spec is read (so a
// schedule registered at run time, as tests do, is accepted too).
SpecKey schedule_key() {
  std::string doc = "pipeline schedule: ";
  const auto& kinds = all_schedules();
  for (size_t i = 0; i < kinds.size(); ++i)
    doc += (i == 0 ? "" : i + 1 == kinds.size() ? " or " : ", ") + kinds[i]->name + " (" + kinds[i]->summary + ")";
  SpecKey k{"parallel", "schedule", doc, nullptr, nullptr};
  k.takes_string = true;
  k.set = [](RunSpec& s, const toml::node& n, const std::string& where) {
    if (!n.is_string()) type_error(where, "parallel.schedule", "a string", n);
    const std::string v = n.as_string()->get();
    if (const ScheduleKind* kind = find_schedule(v)) {
      s.parallel.schedule = kind;
      return;
    }
    std::vector<std::string> names;
    for (const ScheduleKind* kind : all_schedules()) names.push_back(kind->name);
    not_a_choice(where, "parallel.schedule", v, names);
  };
  k.show = [](const RunSpec& s) { return show_string(s.parallel.schedule->name); };
  return k;
}

// data.sources: an array of tables (TOML's [[data.sources]], or inline on --set), each with path
// (required), weight (> 0, default 1), name (default: the path's last part, without extension)
// and val (held-out files).
SpecKey sources_key() {
  SpecKey k{"data", "sources",
            "a mixture: [[data.sources]] tables of path (token files or llm.c shards: a file, a glob or a folder), "
            "weight (its share of the samples, relative to the others'; default 1), name (default: from the path), "
            "val (held-out files; default: the token files' /val) and format (auto, or nanogpt / megatron files "
            "read in place)",
            nullptr, nullptr};
  k.set = [](RunSpec& s, const toml::node& n, const std::string& where) {
    if (!n.is_array()) type_error(where, "data.sources", "an array of tables ([[data.sources]])", n);
    std::vector<RunSpec::Data::Source> sources;
    for (const toml::node& e : *n.as_array()) {
      const std::string at = where + ": data.sources[" + std::to_string(sources.size()) + "]";
      if (!e.is_table()) throw SpecError(at + " must be a table with path and weight, got " + describe(e));
      RunSpec::Data::Source src;
      for (const auto& [key, v] : *e.as_table()) {
        const std::string name(key.str());
        if (name == "path" || name == "name" || name == "val" || name == "format") {
          if (!v.is_string() || v.as_string()->get().empty())
            throw SpecError(at + "." + name + " must be a non-empty string, got " + describe(v));
          (name == "path"     ? src.path
           : name == "val"    ? src.val
           : name == "format" ? src.format
                              : src.name) = v.as_string()->get();
          if (name == "format" && src.format != "auto" && src.format != "nanogpt" && src.format != "megatron")
            throw SpecError(at + ".format = \"" + src.format +
                            "\" is not auto (token files, llm.c shards), nanogpt or megatron");
        } else if (name == "weight") {
          const double w = v.is_integer()          ? static_cast<double>(v.as_integer()->get())
                           : v.is_floating_point() ? v.as_floating_point()->get()
                                                   : -1;
          if (!(w > 0) || !std::isfinite(w)) throw SpecError(at + ".weight must be a number > 0, got " + describe(v));
          src.weight = w;
        } else {
          const std::string hint = closest_match(name, {"path", "weight", "name", "val", "format"});
          throw SpecError(at + ": unknown key " + name + " (a source has path, weight, name, val and format" +
                          (hint.empty() ? "" : "; did you mean " + hint + "?") + ")");
        }
      }
      if (src.path.empty()) throw SpecError(at + " has no path");
      if (src.name.empty()) src.name = source_name_from(src.path);
      for (const auto& other : sources)
        if (other.name == src.name)
          throw SpecError(at + ": two sources are named \"" + src.name + "\" (give each a name = \"...\")");
      sources.push_back(src);
    }
    s.data.sources = sources;
  };
  k.show = [](const RunSpec& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.data.sources.size(); ++i) {
      const auto& src = s.data.sources[i];
      out += (i ? ", " : "") + std::string("{ path = ") + show_string(src.path) +
             (src.val.empty() ? "" : ", val = " + show_string(src.val)) + ", weight = " + show_double(src.weight) +
             ", name = " + show_string(src.name) +
             (src.format == "auto" ? "" : ", format = " + show_string(src.format)) + " }";
    }
    return out + "]";
  };
  return k;
}

SpecKey partition_key() {
  SpecKey k{"parallel", "partition",
            "\"uniform\", \"balanced\" (cost model incl. embedding and head) or a list of blocks per stage "
            "(per chunk under interleaved: pp x virtual_stages entries)",
            nullptr, nullptr};
  k.set = [](RunSpec& s, const toml::node& n, const std::string& where) {
    if (n.is_string()) {
      const std::string v = n.as_string()->get();
      const std::optional<Partition> named = choice_named<Partition>(v);
      if (!named || *named == Partition::explicit_list) {
        std::string hint = closest_match(v, {"uniform", "balanced"});
        throw SpecError(where + ": parallel.partition = \"" + v +
                        "\" is not one of uniform | balanced | [blocks per stage]" +
                        (hint.empty() ? "" : " (did you mean \"" + hint + "\"?)"));
      }
      s.parallel.partition = *named;
      s.parallel.blocks_per_stage.clear();
      return;
    }
    if (!n.is_array()) type_error(where, "parallel.partition", "a string or a list of integers", n);
    std::vector<int> blocks;
    for (auto& e : *n.as_array()) {
      if (!e.is_integer() || e.as_integer()->get() < 1 || e.as_integer()->get() > 1000000)
        throw SpecError(where + ": parallel.partition entries must be integers >= 1 (blocks per stage), got " +
                        describe(e));
      blocks.push_back(static_cast<int>(e.as_integer()->get()));
    }
    if (blocks.empty()) throw SpecError(where + ": parallel.partition list is empty");
    s.parallel.partition = Partition::explicit_list;
    s.parallel.blocks_per_stage = blocks;
  };
  k.show = [](const RunSpec& s) {
    if (s.parallel.partition != Partition::explicit_list) return show_string(name_of(s.parallel.partition));
    std::string out = "[";
    for (size_t i = 0; i < s.parallel.blocks_per_stage.size(); ++i)
      out += (i ? ", " : "") + std::to_string(s.parallel.blocks_per_stage[i]);
    return out + "]";
  };
  return k;
}

#define FIELD(T, expr) [](RunSpec& s) -> T& { return s.expr; }

std::vector<SpecKey> build_schema() {
  const long long big = 1LL << 30;
  return {
      string_key("run", "name", FIELD(std::string, run.name), "run name; run dir is out_dir/name"),
      string_key("run", "out_dir", FIELD(std::string, run.out_dir), "parent folder of run directories"),
      seed_key(),
      int_key("run", "steps", FIELD(int, run.steps), 1, big, "optimizer steps to train"),
      double_key("run", "time_limit", FIELD(double, run.time_limit), 0, 1e9,
                 "wall-clock seconds for this launch; checkpoint and exit 3 before it runs out (0 = none)"),
      choice_key<Device>(
          "run", "device", FIELD(Device, run.device),
          "where each rank computes: cpu, or gpu (one GPU per rank, the node's GPU local rank mod count; "
          "needs a build with PIPETRAIN_CUDA=ON)"),
      choice_key<Arch>("model", "arch", FIELD(Arch, model.arch),
                       "model family: gpt2 (LayerNorm, GELU MLP, learned positions, biases) or llama (RMSNorm, "
                       "SwiGLU MLP, rotary positions, grouped-query attention, no biases)"),
      int_key("model", "n_layer", FIELD(int, model.n_layer), 1, 4096, "transformer blocks"),
      int_key("model", "d_model", FIELD(int, model.d_model), 1, 1 << 16, "embedding width"),
      int_key("model", "n_head", FIELD(int, model.n_head), 1, 1024, "attention heads (must divide d_model)"),
      int_key("model", "seq_len", FIELD(int, model.seq_len), 1, 1 << 20, "tokens per sample (context length)"),
      int_key("model", "vocab", FIELD(int, model.vocab), 2, 1 << 20, "vocabulary size (256 = bytes)"),
      choice_key<Dtype>("model", "dtype", FIELD(Dtype, model.dtype),
                        "matrix-product operands: fp32, or bf16 with fp32 accumulation, fp32 weights, gradients and "
                        "optimizer state (CPU: oneDNN, AVX-512 and up; GPU: cuBLAS)"),
      bool_key("model", "tie_embeddings", FIELD(bool, model.tie_embeddings),
               "LM head shares wte.weight (gradient summed between first and last stage); llama: false "
               "unless set"),
      int_key("model", "n_kv_head", FIELD(int, model.n_kv_head), 0, 1024,
              "llama: key/value heads of grouped-query attention (divides n_head; 1 = multi-query; 0 = n_head)"),
      double_key("model", "rope_theta", FIELD(double, model.rope_theta), 1, 1e12,
                 "llama: base of the rotary position frequencies"),
      int_key("model", "ffn_hidden", FIELD(int, model.ffn_hidden), 0, 1 << 20,
              "llama: SwiGLU hidden width (0 = 2/3 x 4 d_model rounded up to ffn_multiple_of)"),
      int_key("model", "ffn_multiple_of", FIELD(int, model.ffn_multiple_of), 1, 1 << 16,
              "llama: what the default ffn_hidden is rounded up to"),
      double_key("model", "norm_eps", FIELD(double, model.norm_eps), 1e-12, 1, "llama: RMSNorm's epsilon"),
      bool_key("model", "attention_bias", FIELD(bool, model.attention_bias),
               "llama: the q, k and v products have biases (Qwen2's; the output product and the MLP have none)"),
      bool_key("model", "qk_norm", FIELD(bool, model.qk_norm),
               "llama: an RMSNorm (weights q_norm, k_norm) over each token's whole q and whole k, after their "
               "products and before the rotary positions (OLMo 2's and OLMoE's)"),
      int_key("model", "moe.experts", FIELD(int, model.moe.experts), 0, 1 << 16,
              "llama: routed experts of each MoE block, a router sending each token to moe.top_k of them "
              "(0 = a dense model)"),
      int_key("model", "moe.top_k", FIELD(int, model.moe.top_k), 1, 1 << 16, "experts each token is routed to"),
      int_key("model", "moe.ffn_hidden", FIELD(int, model.moe.ffn_hidden), 0, 1 << 20,
              "each expert's SwiGLU hidden width (0 = model.ffn_hidden)"),
      int_key("model", "moe.shared_experts", FIELD(int, model.moe.shared_experts), 0, 1 << 16,
              "always-on experts beside the routed ones, every token through them (one SwiGLU of "
              "shared_experts x moe.ffn_hidden)"),
      int_key("model", "moe.shared_ffn_hidden", FIELD(int, model.moe.shared_ffn_hidden), 0, 1 << 22,
              "the shared experts' SwiGLU width (0 = shared_experts x moe.ffn_hidden; Qwen-MoE's "
              "shared_expert_intermediate_size)"),
      bool_key("model", "moe.shared_gate", FIELD(bool, model.moe.shared_gate),
               "the shared experts' output scaled per token by sigmoid(x . w), w a learned [1, d_model] "
               "(Qwen-MoE's shared_expert_gate)"),
      bool_key("model", "moe.norm_topk", FIELD(bool, model.moe.norm_topk),
               "renormalise the chosen experts' router probabilities to sum to 1 (Mixtral); false: the "
               "probabilities as they are (OLMoE)"),
      int_key("model", "moe.every", FIELD(int, model.moe.every), 1, 4096,
              "every k-th block is an MoE block (block i when (i + 1) % k = 0), the others dense"),
      double_key("model", "moe.capacity_factor", FIELD(double, model.moe.capacity_factor), 0, 1e6,
                 "an expert takes at most ceil(factor x tokens x top_k / experts) of a micro-batch's tokens, the "
                 "rest dropped in token order (their expert output 0); 0 = dropless"),
      double_key("model", "moe.aux_loss", FIELD(double, model.moe.aux_loss), 0, 1e6,
                 "coefficient of each MoE block's load-balancing loss, experts x sum_e f_e P_e (f_e: share of a "
                 "micro-batch's tokens choosing e, P_e: its mean router probability)"),
      double_key("model", "moe.z_loss", FIELD(double, model.moe.z_loss), 0, 1e6,
                 "coefficient of each MoE block's router z-loss, the mean over tokens of logsumexp(router "
                 "logits)^2"),
      choice_key<DataSource>(
          "data", "source", FIELD(DataSource, data.source),
          "synthetic (built-in learnable byte language), text (bytes of data.path) or hdf5 (the train "
          "tokens of a token file made by pipetrain data prepare, read by hyperslab)"),
      string_key("data", "path", FIELD(std::string, data.path),
                 "input file for source = text, or the token file (pipetrain data prepare) for source = hdf5"),
      bool_key("data", "shuffle", FIELD(bool, data.shuffle), "seeded permutation of windows per epoch"),
      sources_key(),
      bool_key("data", "document_mask", FIELD(bool, data.document_mask),
               "attention stays within each document of a packed sequence (a document begins at each "
               "data.document_token), in training, validation and generation"),
      int_key("data", "document_token", FIELD(int, data.document_token), -1, INT32_MAX,
              "the token that begins a document under document_mask: the end-of-document token, last target of "
              "one document and first input of the next; -1: the data's tokenizer's end-of-document token"),
      bool_key("data", "restart_positions", FIELD(bool, data.restart_positions),
               "with document_mask: each document counts its positions from 0 (gpt2's position table, llama's "
               "rotary angles), as if it began the sequence"),
      int_key("parallel", "tp", FIELD(int, parallel.tp), 1, 1024,
              "tensor-parallel ranks per stage: each holds n_head / tp attention heads, 1/tp of the MLP and "
              "of the vocabulary (consecutive ranks, so a tensor group shares a node)"),
      bool_key("parallel", "sequence_parallel", FIELD(bool, parallel.sequence_parallel),
               "with tp > 1: each tensor rank keeps 1/tp of a micro-batch's tokens outside the matrix products "
               "(norms, residuals, pipeline messages), all-gathered before them and reduce-scattered after"),
      int_key("parallel", "pp", FIELD(int, parallel.pp), 1, 65536, "pipeline stages"),
      int_key("parallel", "dp", FIELD(int, parallel.dp), 1, 1 << 20,
              "data-parallel replicas (unset: the ranks tp x pp leave, 1 where no ranks are launched)"),
      int_key("parallel", "micro_batches", FIELD(int, parallel.micro_batches), 1, 1 << 20,
              "micro-batches per step (M)"),
      schedule_key(),
      choice_key<RankOrder>(
          "parallel", "order", FIELD(RankOrder, parallel.order),
          "rank order, i.e. what shares a node: pp = a pipeline's stages are consecutive ranks (p2p stays "
          "in a node), dp = a stage's replicas are (the gradient all-reduce stays in a node)"),
      int_key("parallel", "virtual_stages", FIELD(int, parallel.virtual_stages), 1, 1024,
              "model chunks per rank under schedule = interleaved (rank s runs virtual stages s, s+pp, ...); "
              "zb-v and dualpipev run 2, their default"),
      partition_key(),
      int_key("parallel", "threads_per_rank", FIELD(int, parallel.threads_per_rank), 0, 1024,
              "BLAS threads per rank (0 = OPENBLAS_NUM_THREADS if set, else cores of the node / ranks on it)"),
      choice_key<Recompute>("parallel", "recompute", FIELD(Recompute, parallel.recompute),
                            "activation recompute: keep everything, only each stage's input, or each block's input"),
      int_key("parallel", "zero", FIELD(int, parallel.zero), 0, 3,
              "what the dp replicas of a stage shard, each keeping one row slab of every tensor: 1 = AdamW's "
              "state (ZeRO-1), 2 = also the summed gradients (ZeRO-2), 3 = also the weights, all-gathered layer "
              "by layer before each pass and freed after (ZeRO-3); 0 = every replica keeps all"),
      reshard_key(),
      int_key("parallel", "ep", FIELD(int, parallel.ep), 1, 1 << 20,
              "expert-parallel ranks: each MoE block's experts spread over ep consecutive data-parallel "
              "replicas (experts / ep on each), a token's rows sent to its experts' rank and back by "
              "all-to-all; ep divides dp and model.moe.experts"),
      bool_key("parallel", "auto", FIELD(bool, parallel.automatic),
               "at every launch, lay the run out on the ranks it was given as plan --auto would (tp, pp, dp, "
               "micro-batches, schedule, chunks, recompute, partition, zero, ep), from costs measured at the "
               "run's first launch (RUN_DIR/costs.json); a value given for one of those keys is replaced, and said"),
      int_key("train", "global_batch", FIELD(int, train.global_batch), 1, big,
              "samples per optimizer step (divisible by dp x micro_batches)"),
      double_key("train", "lr", FIELD(double, train.lr), 0, 10, "peak learning rate"),
      double_key("train", "min_lr", FIELD(double, train.min_lr), 0, 10, "learning rate at the end of cosine decay"),
      int_key("train", "warmup_steps", FIELD(int, train.warmup_steps), 0, big, "linear warmup steps"),
      double_key("train", "weight_decay", FIELD(double, train.weight_decay), 0, 10,
                 "AdamW decoupled weight decay (2-D weights only)"),
      double_key("train", "beta1", FIELD(double, train.beta1), 0, 0.999999, "AdamW beta1"),
      double_key("train", "beta2", FIELD(double, train.beta2), 0, 0.999999999, "AdamW beta2"),
      double_key("train", "eps", FIELD(double, train.eps), 1e-30, 1, "AdamW epsilon"),
      double_key("train", "grad_clip", FIELD(double, train.grad_clip), 0, 1e30,
                 "global gradient-norm clip over all stages (0 = off)"),
      int_key("train", "max_bad_steps", FIELD(int, train.max_bad_steps), 1, big,
              "consecutive steps with a NaN/Inf loss or gradient (each skipped) before the run stops"),
      string_key("train", "init_from", FIELD(std::string, train.init_from),
                 "start a fresh run from these weights instead of a random init: a Hugging Face GPT-2 directory "
                 "or .safetensors file, an llm.c model file or a pipetrain checkpoint (any layout); step 0, fresh "
                 "optimizer state. Ignored when the run resumes a checkpoint (\"\" = random init)"),
      int_key("eval", "every_steps", FIELD(int, eval.every_steps), 0, big,
              "validation loss every N steps and at the end, as val_loss (0 = never); data: the token file's "
              "/val (source = hdf5) or held-out text of the synthetic language"),
      int_key("eval", "batches", FIELD(int, eval.batches), 1, 1 << 20,
              "global batches of validation samples per evaluation (the same samples every time)"),
      int_key("checkpoint", "every_steps", FIELD(int, checkpoint.every_steps), 0, big,
              "save every N steps (0 = only at the end and on a stop signal)"),
      bool_key("checkpoint", "at_end", FIELD(bool, checkpoint.at_end),
               "save when the run reaches run.steps; false for benchmarks and smoke runs that keep nothing "
               "(every_steps and a stop signal still save)"),
      int_key("checkpoint", "keep_last", FIELD(int, checkpoint.keep_last), 0, big,
              "complete checkpoints to keep, oldest removed first (0 = keep all)"),
      choice_key<OnSaveError>("checkpoint", "on_error", FIELD(OnSaveError, checkpoint.on_error),
                              "a failed save (disk full, read-only, ...): warn and train on, or stop with exit 1; the "
                              "previous checkpoint stays intact either way, and a failed final save always exits 1"),
      bool_key("checkpoint", "async", FIELD(bool, checkpoint.async),
               "write checkpoints in the background: training waits only while each rank copies its part into "
               "a host snapshot; the next save, a stop and the end of the run wait for the write"),
      int_key("log", "every_steps", FIELD(int, log.every_steps), 1, big, "log a metrics line every N steps"),
      int_key("log", "trace_steps", FIELD(int, log.trace_steps), 0, 1000,
              "first steps of each launch recorded in trace.json (Chrome/Perfetto; 0 = no trace)"),
      double_key("log", "straggler_ratio", FIELD(double, log.straggler_ratio), 0, 100,
                 "a rank, node or link slower than its peers by this factor in two detection windows in a row is "
                 "reported as a straggler (progress output, metrics.jsonl \"stragglers\"); 0 = no detection"),
      int_key("log", "straggler_window", FIELD(int, log.straggler_window), 1, big,
              "steps per straggler detection window (which also lasts one second at least): each rank's medians "
              "over it are compared at the first logging step after"),
      choice_key<StragglerAction>(
          "log", "straggler_action", FIELD(StragglerAction, log.straggler_action),
          "what a persistent straggler leads to: log names it; exclude checkpoints and stops (exit 3) to be requeued "
          "without a node slow in straggler_act_after windows in a row, where the job script says it can spare one; "
          "rebalance checkpoints and restarts in-process on a partition re-solved from each rank's measured speed, "
          "giving a rank slow in straggler_act_after windows in a row fewer blocks"),
      int_key(
          "log", "straggler_act_after", FIELD(int, log.straggler_act_after), 2, big,
          "windows in a row a node or rank must be over log.straggler_ratio before log.straggler_action acts on it"),
      double_key(
          "log", "peak_gflops", FIELD(double, log.peak_gflops), 0, 1e9,
          "peak GFLOP/s of one rank for MFU (0 = the hardware's: FLOPs per cycle x clock of each core, or the GPU's)"),
      choice_key<WaitPolicy>("comm", "wait", FIELD(WaitPolicy, comm.wait),
                             "how waits poll: auto yields when ranks outnumber cores"),
      double_key("comm", "timeout_s", FIELD(double, comm.timeout_s), 0.001, 1e9,
                 "a wait longer than this is an error naming stage, peer, node and micro-batch; after "
                 "start-up it also bounds waits for all ranks to agree (in a save: + 4x the longest save)"),
      choice_key<FinalizePolicy>(
          "comm", "finalize", FIELD(FinalizePolicy, comm.finalize),
          "how a finished run leaves MPI: skip = barrier, then exit without MPI_Finalize (MPICH "
          "over UCX/TCP hangs in it with 3+ ranks across nodes); auto = skip when ranks span nodes"),
      double_key("comm", "finalize_timeout_s", FIELD(double, comm.finalize_timeout_s), 0, 1e9,
                 "exit anyway if MPI_Finalize (or skip's barrier) has not returned this long after a "
                 "finished run; everything is saved first; 0 = wait forever"),
      double_key("comm", "bucket_mb", FIELD(double, comm.bucket_mb), 0.0625, 1e6,
                 "data-parallel gradient all-reduce bucket size (MiB)"),
  };
}

#undef FIELD

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates, size_t max_distance) {
  std::string best;
  size_t best_d = (max_distance > 0 ? max_distance : std::max<size_t>(2, word.size() / 3)) + 1;
  for (auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

const std::vector<SpecKey>& spec_schema() {
  static const std::vector<SpecKey> schema = build_schema();
  return schema;
}

const SpecKey* find_spec_key(const std::string& dotted) {
  const auto& schema = spec_schema();
  auto it = std::find_if(schema.begin(), schema.end(), [&](const SpecKey& k) { return k.dotted() == dotted; });
  return it == schema.end() ? nullptr : &*it;
}

}  // namespace pipetrain
