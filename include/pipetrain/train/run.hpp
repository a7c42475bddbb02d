// Everything a training run holds once start-up has succeeded on every rank, grouped into the parts
// each phase needs: where the rank sits (layout), its token streams (input), the run directory and
// checkpoints (state), its model slice and schedule (model), its communicators (comms), what it
// measures and logs (telemetry) and the loop's policies. start_up() builds it; the loop in
// train.cpp reads it.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/ckpt/save.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/data/dataset.hpp"
#include "pipetrain/dist/comm.hpp"
#include "pipetrain/dist/launch.hpp"
#include "pipetrain/interop/model_import.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optim.hpp"
#include "pipetrain/observe/metrics.hpp"
#include "pipetrain/observe/trace.hpp"
#include "pipetrain/pipeline/executor.hpp"
#include "pipetrain/train/auto_layout.hpp"
#include "pipetrain/train/grad_sync.hpp"
#include "pipetrain/train/param_fetch.hpp"
#include "pipetrain/train/policies.hpp"
#include "pipetrain/train/straggler_action.hpp"
#include "pipetrain/train/train.hpp"
#include "pipetrain/util/files.hpp"

namespace pipetrain {

// Where this rank sits and what shape its steps have: agreed first, fixed for the run.
struct RunLayout {
  LaunchInfo launch;
  StepShape shape;  // the step's sizes, derived once from the spec
  Topology topo;
  std::vector<int> blocks;  // per virtual stage
  int blas_threads = 1;
};

// The token streams: training (first and last stage) and validation (when evaluating).
struct RunInput {
  std::unique_ptr<Dataset> data, val;
  std::string tokenizer_model;  // rank 0: the token file's SentencePiece model, if any
};

// The run directory (rank 0 holds its lock), its checkpoints, where training resumed from or the
// train.init_from source it starts from, and its launch history.
struct RunState {
  std::string run_dir, run_dir_note;  // note: what became of an earlier run's files
  std::unique_ptr<RunDirLock> lock;
  std::unique_ptr<Checkpointer> checkpointer;
  std::string resumed_from;  // "" for a fresh start
  int64_t start_step = 0;
  std::unique_ptr<ModelImport> init;      // a fresh start with train.init_from: its source, until loaded
  std::string init_note;                  // what was loaded from where, for the start lines
  int64_t last_saved = -1;                // the latest checkpoint of this run, -1: none yet
  int launch_index = 0;                   // 1 for the run's first launch (events.jsonl), rank 0
  CutLog cut_log;                         // rank 0: what resuming cut from earlier launches' log
  std::optional<AutoLayout> auto_layout;  // parallel.auto: this launch's choice
};

// This rank's model slice, optimizer and schedule.
struct RunModel {
  std::unique_ptr<Stage> stage;
  std::unique_ptr<AdamW> adam;
  std::unique_ptr<Executor> executor;
  ActionList actions, eval_actions;       // eval: the forwards alone
  std::vector<int> inputs, targets;       // one micro-batch's tokens, read just before its forward
  const ParamTensor* tied_wte = nullptr;  // where this stage takes part in the tied embedding's sum
};

// The communicators and the step boundary's exchanges: gradient sums over replicas (through
// `grad_staging` on the GPU, pinned so that its downloads run beside the backward) and with ZeRO-1
// the updated slabs' all-gather (through `param_staging` on the GPU).
struct RunComms {
  std::unique_ptr<Comm> comm;
  std::vector<float> grad_staging, param_staging;
  HostPin grad_staging_pinned;            // (unpinned before the buffer goes: declared after it)
  std::vector<float> grad_shard_staging;  // ZeRO-2, 3 on the GPU: the summed slabs, on their way up
  std::unique_ptr<GradReducer> reducer;
  std::unique_ptr<ParamGather> param_gather;
  std::unique_ptr<LayerGather>
      layer_gather;  // ZeRO-3: weights gathered layer by layer (through param_staging on the GPU)
};

// What the loop measures and logs: MFU's denominators (fixed at the run's first launch and kept
// in events.jsonl), the trace, metrics.jsonl and the straggler windows.
struct RunTelemetry {
  double peak_gflops = 0, sgemm_gflops = 0;      // the job's: the hardware's peak; its BLAS GEMM rate
  double peak_per_unit = 0, sgemm_per_unit = 0;  // the same of one core (one GPU)
  std::string peak_basis;                        // how peak_per_unit was found, for the start line
  double flops_per_step = 0, tokens_per_step = 0, bubble_theory = 0;
  Trace trace;
  double clock_offset_s = 0;                          // world rank 0's clock reads ~ now_s() + this (0 on its node)
  std::unique_ptr<MetricsWriter> metrics;             // rank 0 writes
  std::unique_ptr<StragglerWindow> straggler_window;  // every rank, when log.straggler_ratio > 0
  std::unique_ptr<StragglerDetector> stragglers;      // rank 0, likewise
  bool straggler_cpu_time = false;                    // windows compare the passes' CPU time, not wall time
  std::unique_ptr<StragglerPolicy> straggler_policy;  // rank 0, unless log.straggler_action = log
  StragglerMove straggler_move;                       // rank 0: decided, made after the next step
  LaunchTotals totals;                                // where this launch's time went (rank 0's count is logged)
};

// What the loop decides with besides the spec: the time budget and the non-finite steps' count.
struct RunPolicies {
  std::unique_ptr<TimeBudget> budget;
  std::unique_ptr<BadSteps> bad_steps;
};

// Everything a run holds once start-up has succeeded on every rank, in the parts each phase needs.
struct Run {
  Run(World& w, const TrainOptions& o) : world(w), opt(o) {}
  World& world;
  TrainOptions opt;
  double launched_s = 0;    // now_s() when the command started (run.time_limit counts from here)
  double started_unix = 0;  // wall clock when this launch began: the process, or an in-process restart
  RunSpec spec;
  RunLayout layout;
  RunInput input;
  RunState state;
  RunModel model;
  RunComms comms;
  RunTelemetry telemetry;
  RunPolicies policies;

  bool on_gpu() const { return compute_device() == Device::gpu; }
  int rank() const { return world.rank(); }
};

// Every start-up step, each agreed by all ranks (a failure anywhere makes every rank return the
// same code, and only the failing rank says why): the spec and data, the communicators and device,
// the model's fit in memory, the run directory and its lock, the checkpoint to resume from (or on a
// fresh start the train.init_from source, matched against the spec), the model slice (loaded or
// initialised), the schedule.
ExitCode start_up(Run& run);

// Rank 0: the lines that say what this run is (layout, node map, partition, run dir, resume).
void print_start(const Run& run);

// Validation, the same on every rank: the mean token loss over eval.batches fixed global batches;
// for a mixture of several sources also each source's own (its held-out windows in order, over as
// many of those batches as they hold; -1 where they hold not one).
struct Validation {
  double loss = -1;
  std::vector<double> by_source;
};
Validation evaluate(Run& run);

// Loads micro-batch `mb` of global batch `index` of `data` into the stage (the executor's
// load_inputs): tokens on the first virtual stage, targets on the last.
std::function<void(int)> inputs_from(const RunLayout& layout, RunModel& model, Dataset* data, int64_t index);

// The executor's params_needed under ZeRO-1: waits for a chunk's all-gathered weights; null
// without sharding.
std::function<bool(int)> params_ready(const RunModel& model, RunComms& comms);

}  // namespace pipetrain
