// Run spec: what the user asked for, read from TOML plus --set overrides, checked before anything
// is allocated. The schema (every key, its type, default and doc) lives in spec_schema.cpp so that
// parsing, validation, the resolved config.toml and docs/spec-reference.md all come from one table.
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipetrain/config/choices.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/util/errors.hpp"

namespace pipetrain {

struct RunSpec {
  struct Run {
    std::string name = "tiny";
    std::string out_dir = "runs";
    int64_t seed = 1234;
    int steps = 100;
    double time_limit = 0;  // seconds this launch may run; stops with a checkpoint before (0 = none)
    Device device = Device::cpu;
  } run;
  struct Model {
    Arch arch = Arch::gpt2;
    int n_layer = 4;
    int d_model = 64;
    int n_head = 4;
    int seq_len = 32;
    int vocab = 256;
    Dtype dtype = Dtype::fp32;   // matrix-product inputs (bf16 on the GPU only)
    bool tie_embeddings = true;  // llama: false unless set
    // The llama family's (model/block_tensors.hpp); a gpt2 spec leaves them at their defaults.
    int n_kv_head = 0;  // key/value heads (grouped-query attention); 0 = n_head
    double rope_theta = 10000;
    int ffn_hidden = 0;  // SwiGLU width; 0 = 2/3 x 4 d_model rounded up to ffn_multiple_of
    int ffn_multiple_of = 256;
    double norm_eps = 1e-5;       // RMSNorm's
    bool attention_bias = false;  // q, k and v products with biases (Qwen2's)
    bool qk_norm = false;         // an RMSNorm over each token's whole q and whole k (OLMo 2's, OLMoE's)
    // A mixture of experts (llama family, model/block_tensors.hpp): in an MoE block a router sends
    // each token to top_k of `experts` SwiGLU experts, beside any always-on shared experts.
    struct Moe {
      int experts = 0;  // routed experts per MoE block; 0 = a dense model
      int top_k = 2;
      int ffn_hidden = 0;          // each expert's SwiGLU width; 0 = model.ffn_hidden
      int shared_experts = 0;      // always-on experts, one SwiGLU of shared_experts x ffn_hidden
      int shared_ffn_hidden = 0;   // that SwiGLU's width instead (Qwen-MoE's shared_expert_intermediate_size)
      bool shared_gate = false;    // its output scaled per token by sigmoid(x . w) (Qwen-MoE's shared_expert_gate)
      bool norm_topk = true;       // the chosen experts' weights renormalised to sum to 1
      int every = 1;               // block i is an MoE block when (i + 1) % every == 0
      double capacity_factor = 0;  // 0 = dropless; else an expert takes ceil(factor x tokens x top_k / experts)
      double aux_loss = 0.01;      // the load-balancing loss's coefficient
      double z_loss = 0;           // the router z-loss's coefficient
      bool on() const { return experts > 0; }
      bool block_is_moe(int block) const { return on() && (block + 1) % every == 0; }
    } moe;
  } model;
  struct Data {
    DataSource source = DataSource::synthetic;
    std::string path;  // the text file (text) or token file (hdf5)
    bool shuffle = true;
    // A mixture ([[data.sources]], data/mixture.hpp): each token files or llm.c shards (a file, a
    // glob or a folder), drawn from in proportion to its weight. Given, data.source is hdf5 and
    // data.path unset.
    struct Source {
      std::string path;
      std::string val;  // held out: other files (llm.c shards hold one split); default: path's token files' /val
      double weight = 1;
      std::string name;  // in messages and metrics; default: the path's last part without extension
      // How its files hold ids: "auto" (token files and llm.c shards, told apart by content),
      // "nanogpt" (headerless uint16 files) or "megatron" (indexed datasets: path names prefixes).
      std::string format = "auto";
    };
    std::vector<Source> sources;
    // Document masking (model/documents.hpp): attention stays within the documents of a packed
    // sequence, each beginning at a document_token (-1: the data's tokenizer's end-of-document token).
    bool document_mask = false;
    int document_token = -1;
    bool restart_positions = false;  // positions count from 0 in each document
  } data;
  struct Parallel {
    int tp = 1;                      // tensor-parallel ranks: each splits every matrix of its stage (Megatron-style)
    bool sequence_parallel = false;  // tp > 1: the residual stream's tokens split among the tensor ranks too
    int pp = 1;
    int dp = 1;
    int micro_batches = 4;
    const ScheduleKind* schedule = &schedule_named("gpipe");  // an entry of the schedule registry
    int virtual_stages = 1;                                   // model chunks per rank (interleaved schedule)
    RankOrder order = RankOrder::pp;  // pp: a pipeline's stages are consecutive ranks | dp: a stage's replicas are
    Partition partition = Partition::uniform;  // explicit_list: blocks_per_stage holds the list
    std::vector<int> blocks_per_stage;         // explicit partition, one entry per (virtual) stage
    Recompute recompute = Recompute::none;
    // What the data-parallel replicas of a stage shard: 1 AdamW's state (ZeRO-1), 2 also the summed
    // gradients (ZeRO-2), 3 also the weights (ZeRO-3, fully sharded); 0 nothing.
    int zero = 0;
    // Expert parallelism: the experts of each MoE block spread over ep consecutive data-parallel
    // replicas (dp_rank / ep names the group, dp_rank % ep the place in it), each holding experts / ep
    // of them, tokens sent to their experts' rank and back by all-to-all; 1 = every replica holds all.
    int ep = 1;
    // ZeRO-3: free a layer's gathered weights between a micro-batch's forward and its backward
    // (gathered again for the backward); -1 = unset: true under pp 1, false under pipelining,
    // where a step's micro-batches then share one gather (reshards_after_forward()).
    int reshard_after_forward = -1;
    bool reshards_after_forward() const { return reshard_after_forward < 0 ? pp == 1 : reshard_after_forward == 1; }
    int threads_per_rank = 0;  // BLAS threads per rank; 0 = OPENBLAS_NUM_THREADS or cores / ranks per node
    // parallel.auto: every launch lays the run out on the ranks it was given (train/auto_layout.hpp);
    // the layout keys above are then its choice, never the file's.
    bool automatic = false;
  } parallel;
  struct Train {
    int global_batch = 16;
    double lr = 3e-3;
    double min_lr = 3e-4;
    int warmup_steps = 5;
    double weight_decay = 0.1;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double grad_clip = 1.0;
    int max_bad_steps = 5;  // consecutive steps with a non-finite loss or gradient before the run stops
    std::string init_from;  // weights a fresh start begins from (a model directory or file); "" = random init
  } train;
  struct Eval {
    int every_steps = 0;  // validation loss every N steps and at the end (0 = never)
    int batches = 4;      // global batches of validation samples, the same ones every time
  } eval;
  struct Checkpoint {
    int every_steps = 50;  // also saved at the end of the run (unless at_end = false) and on a stop signal
    bool at_end = true;    // false: a run that reaches run.steps keeps nothing new (benchmarks)
    int keep_last = 3;     // 0 keeps all
    OnSaveError on_error = OnSaveError::warn;  // a failed save: warn and train on | stop (exit 1)
    bool async = false;                        // write in the background from a host snapshot while training goes on
  } checkpoint;
  struct Log {
    int every_steps = 1;
    double peak_gflops = 0;         // per rank, for MFU; 0 = measure sgemm at start
    int trace_steps = 3;            // steps of each launch recorded in trace.json (0 = none)
    double straggler_ratio = 1.25;  // slower than its peers by this: a straggler (0 = no detection)
    int straggler_window = 10;      // steps per detection window (observe/stragglers.hpp)
    StragglerAction straggler_action = StragglerAction::log;  // what a persistent straggler leads to
    int straggler_act_after = 3;                              // windows in a row over the ratio before acting
  } log;
  struct Comm {
    WaitPolicy wait = WaitPolicy::automatic;
    double timeout_s = 120;
    double bucket_mb = 4;
    // Floats per data-parallel gradient bucket (at least one): what GradReducer cuts and plan prices.
    size_t bucket_floats() const {
      return std::max<size_t>(1, static_cast<size_t>(bucket_mb * (1 << 20) / sizeof(float)));
    }
    FinalizePolicy finalize = FinalizePolicy::automatic;  // how a finished run leaves MPI
    double finalize_timeout_s = 30;                       // bound on that last wait (0 = wait forever)
  } comm;

  // Where each key was set ("file:line" or "--set"); keys left at their default are absent.
  std::vector<std::pair<std::string, std::string>> origins;
  std::string origin(const std::string& dotted_key) const;
  // What parsing skipped and the user should hear about (a retired key, "file:line: ...").
  std::vector<std::string> notes;

  // Derived sizes (valid after validation).
  int samples_per_micro_batch() const { return train.global_batch / (parallel.dp * parallel.micro_batches); }
  PipelineShape pipeline_shape() const {
    return {parallel.pp, parallel.micro_batches, parallel.virtual_stages, model.n_layer};
  }
  ChunkPlacement chunk_placement() const { return parallel.schedule->placement_of(pipeline_shape()); }
};

// The shape of one training step, from a validated spec: what a rank's stage, executor and
// gradient scale are built for, computed once at start-up.
struct StepShape {
  int stages = 1, replicas = 1, micro_batches = 1, chunks = 1;  // P, D, M, V
  int samples = 1;                                              // per micro-batch: global_batch / (D M)
  int seq_len = 1, d_model = 1;                                 // T, C
  Placement placement = Placement::loop;                        // the schedule's (schedule/placement.hpp)
  int virtual_stages() const { return stages * chunks; }
  ChunkPlacement chunk_placement() const { return {stages, chunks, placement}; }
  size_t boundary_floats() const { return static_cast<size_t>(samples) * seq_len * d_model; }  // one activation
  // dLoss/d(token loss): the loss is the mean over the global batch's tokens (1/M per micro-batch,
  // 1/D per replica).
  float grad_scale() const { return 1.0f / (static_cast<float>(samples) * seq_len * micro_batches * replicas); }
};
StepShape step_shape(const RunSpec& spec);
// The llama family's default SwiGLU width: 2/3 of 4 d_model, rounded up to a multiple.
int llama_ffn_hidden(int d_model, int multiple_of);

// Reads `path` (empty: built-in defaults), applies "section.key=value" overrides, validates.
constexpr const char* kLaunchedRanks = "MPI ranks were launched";
// A value taken from where it already is (the token file's vocab_size, an init_from model's
// config.json) for a key the spec leaves unset: the dotted key, its value as TOML text, and where
// it came from (shown as the key's origin: "data.path's vocab_size").
struct ImpliedKey {
  std::string key, value, from;
};
// What a spec is read against besides its text: how the ranks it is laid out on are named in
// refusals, and the implied keys.
struct SpecContext {
  std::string ranks_are = kLaunchedRanks;  // "MPI ranks were launched", "ranks are planned (plan --world)"
  std::vector<ImpliedKey> implied;
};

// Reads `path` (empty: built-in defaults), applies "section.key=value" overrides, then the
// context's implied keys the file and overrides leave unset, and validates.
// world_size > 0 lays the spec out on that many ranks: parallel.dp, where neither the file nor an
// override sets it, takes the ranks tp × pp leave, and tp × pp × dp is checked against it;
// kAnyLayout leaves the layout keys unchecked (for a caller that picks the layout itself) and
// checks the rest on one rank; kUnchecked validates nothing (for a caller that reads keys to find
// the implied ones). Throws SpecError naming key and file:line.
constexpr int kAnyLayout = -1;
constexpr int kUnchecked = -2;
RunSpec load_spec(const std::string& path, const std::vector<std::string>& overrides, int world_size,
                  const SpecContext& context = {});
// The same for spec text already read; `path` names it in messages (empty: defaults, text unused).
RunSpec parse_spec(const std::string& text, const std::string& path, const std::vector<std::string>& overrides,
                   int world_size, const SpecContext& context = {});

// Checks ranges and combinations; called by load_spec, exposed for tests.
void validate_spec(const RunSpec& spec, int world_size, const std::string& ranks_are = kLaunchedRanks);
// What keeps parallel.tp from splitting the spec's model, naming the key ("" when nothing): query
// heads, key/value heads or the MLP's width that it does not divide.
std::string tensor_parallel_problem(const RunSpec& spec);

// "pp 2 x dp 2" ("tp 2 x pp 2 x dp 2" with tensor ranks): how a grid of ranks is named in output.
std::string grid_text(int tp, int pp, int dp);

// The resolved spec as TOML text with every key, each followed by its doc as a comment.
std::string resolved_toml(const RunSpec& spec);

// Stable 64-bit hash of the resolved spec, so ranks can check they agree.
uint64_t spec_hash(const RunSpec& spec);

// Markdown table of all keys (section, key, default, meaning): docs/spec-reference.md.
std::string spec_reference_markdown();

}  // namespace pipetrain
