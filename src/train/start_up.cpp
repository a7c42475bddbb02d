#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "pipetrain/ckpt/resume.hpp"
#include "pipetrain/compute/bf16_products.hpp"
#include "pipetrain/compute/blas.hpp"
#include "pipetrain/compute/blas_kernels.hpp"
#include "pipetrain/compute/cpu_features.hpp"
#include "pipetrain/compute/device.hpp"
#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/parallel_for.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/planner/plan.hpp"
#include "pipetrain/train/run.hpp"
#include "pipetrain/train/run_dir.hpp"
#include "pipetrain/train/run_history.hpp"
#include "pipetrain/train/run_spec.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/faults.hpp"
#include "pipetrain/util/version.hpp"

namespace fs = std::filesystem;

namespace pipetrain {
namespace {

// Refuses, before anything large is allocated, a model whose stage cannot fit in this rank's share
// of the node's memory, or of its GPU's when it computes on one (plan's prediction: parameters,
// gradients, AdamW (this replica's shard under parallel.zero = 1), stashed activations, working
// buffers and the kernels' scratch, on the GPU its bf16 operand copies among them).
void check_memory_fits(const RunSpec& spec, int stage, int local_ranks) {
  const Plan plan = make_plan(spec);
  const StagePlan& s = plan.stages[stage];
  const bool on_gpu = compute_device() == Device::gpu;
  const double gib = 1024.0 * 1024 * 1024, state = s.state_bytes(spec), need = s.memory_bytes(spec);
  const int sharing = on_gpu ? (local_ranks + gpu::device_count() - 1) / gpu::device_count() : local_ranks;
  const double share = (on_gpu ? gpu::memory_total() : node_memory_bytes()) / sharing;
  if (need <= share) return;
  char msg[512];
  std::snprintf(msg, sizeof msg,
                "the model does not fit: stage %d needs about %.1f GiB (parameters, gradients, AdamW%s %.1f GiB, "
                "activations under recompute = %s %.1f GiB), but each of the %d ranks on this %s has %.1f GiB; "
                "use more stages (parallel.pp), parallel.recompute, fewer or smaller micro-batches, or a smaller model",
                stage, need / gib, spec.checkpoint.async ? " and the checkpoint snapshot" : "", state / gib,
                name_of(spec.parallel.recompute), (need - state) / gib, sharing, on_gpu ? "GPU" : "node", share / gib);
  throw SpecError(msg);
}

// Validation reads its windows in order: more samples than the held-out tokens hold would wrap
// around and count some twice, which a loss over "N batches" must not do silently.
void check_validation_fits(const RunSpec& spec, const Dataset& val, bool eval_command) {
  const int64_t need = static_cast<int64_t>(spec.eval.batches) * spec.train.global_batch;
  const std::string short_of = val.repeats_within(need);
  if (short_of.empty()) return;
  int64_t fit = 0;  // whole batches that do fit
  while (fit < spec.eval.batches && val.repeats_within((fit + 1) * spec.train.global_batch).empty()) ++fit;
  throw SpecError(spec.origin("eval.batches") + ": " +
                  (eval_command ? "eval" : "eval.batches = " + std::to_string(spec.eval.batches)) + " needs " +
                  std::to_string(need) + " validation windows of " + std::to_string(spec.model.seq_len) +
                  " tokens, but " + short_of +
                  (fit > 0 ? "; at most " + std::to_string(fit) + " batches fit"
                           : "; not one batch of train.global_batch fits (more validation data)"));
}

// The spec (or for eval without --config, the checkpoint's own), this rank's place in the grid
// and its data.
void read_spec_and_data(Run& run) {
  const TrainOptions& opt = run.opt;
  const int world = run.world.size();
  // srun without an MPI plugin starts N singletons that each see one rank: say so.
  if (run.layout.launch.in_step && run.layout.launch.ntasks > 1 && world == 1)
    throw SpecError("srun started " + std::to_string(run.layout.launch.ntasks) +
                    " tasks but MPI sees 1 rank: launch with srun --mpi=pmi2 (MPICH)");
  // eval may name a run directory or its checkpoints: its spec is that of the newest one (the
  // model is the same in all; select_checkpoint picks the newest intact one to load).
  const std::vector<std::string> named =
      opt.eval_only ? checkpoints_named_by(opt.resume.path) : std::vector<std::string>{};
  // parallel.auto: the layout is chosen for these ranks first, then the spec read on it.
  std::vector<std::string> overrides = opt.overrides;
  std::optional<RunSpec> as_given;
  if (!opt.eval_only) {
    as_given = load_run_spec(opt.config, opt.overrides, kAnyLayout);
    if (as_given->parallel.automatic) {
      run.state.auto_layout = choose_layout(*as_given, run.world, resolve_run_dir(opt.run_dir, *as_given));
      const std::vector<std::string>& chosen = run.state.auto_layout->overrides;
      overrides.insert(overrides.end(), chosen.begin(), chosen.end());
    }
  }
  overrides.insert(overrides.end(), opt.restart_overrides.begin(), opt.restart_overrides.end());
  run.spec = opt.eval_only && opt.config.empty()
                 ? spec_of_checkpoint(named.empty() ? opt.resume.path : named.front(), opt.overrides, world)
                 : load_run_spec(opt.config, overrides, world);
  if (run.state.auto_layout) credit_auto_layout(run.spec, *as_given, *run.state.auto_layout);
  if (opt.eval_only && run.spec.eval.every_steps == 0) run.spec.eval.every_steps = 1;  // load validation data
  if (opt.eval_batches > 0) {
    run.spec.eval.batches = opt.eval_batches;
    run.spec.origins.emplace_back("eval.batches", "--batches " + std::to_string(opt.eval_batches));
  }
  const RunSpec& spec = run.spec;
  run.layout.shape = step_shape(spec);
  run.layout.topo = Topology::of(run.world.rank(), spec.parallel.pp, spec.parallel.dp, spec.parallel.order,
                                 spec.chunk_placement().head_stage() == 0, spec.parallel.tp);
  run.layout.topo.ep = spec.parallel.ep;
  run.layout.blocks = partition_blocks(spec);
  // The tokens reach the first stage, the targets the last; under document masking every stage
  // reads the tokens for where documents begin. Every rank knows how many batches each source's
  // own validation takes (a mixture's), from its held-out files.
  const bool reads_tokens = run.layout.topo.first_stage() || run.layout.topo.holds_head() || spec.data.document_mask;
  if (reads_tokens) run.input.data = std::make_unique<Dataset>(spec);
  if (spec.eval.every_steps > 0 && (reads_tokens || spec.data.sources.size() > 1)) {
    run.input.val = std::make_unique<Dataset>(spec, Split::val);
    check_validation_fits(spec, *run.input.val, opt.eval_only);
  }
  // The run keeps its tokenizer (in RUN_DIR and every checkpoint); the file opened above.
  if (run.world.rank() == 0 && spec.data.source == DataSource::hdf5 && !spec.data.sources.empty() && !opt.eval_only) {
    // The mixture opened above (rank 0 is a first stage); its sources are all tokenized alike.
    run.input.tokenizer_model = run.input.data->mixture()->source(0).tokenizer_model();
  } else if (run.world.rank() == 0 && spec.data.source == DataSource::hdf5 && !opt.eval_only) try {
      run.input.tokenizer_model = read_token_file_info(spec.data.path).tokenizer_model;
    } catch (const SpecError& e) {
      throw SpecError(spec.origin("data.path") + ": data.path: " + e.what());
    }
}

// Every rank runs the same spec with the same stage shapes, within this MPI's tag range, on its
// device, and the model fits there.
void check_ranks_and_device(Run& run) {
  const RunSpec& spec = run.spec;
  const StepShape& shape = run.layout.shape;
  const std::vector<int64_t> boundary = {shape.samples, shape.seq_len, shape.d_model,
                                         static_cast<int64_t>(sizeof(float))};
  if (!run.comms.comm->all_equal(spec_hash(spec)) || !run.comms.comm->boundary_agrees(boundary, boundary))
    throw SpecError("ranks disagree on the run spec or stage shapes (different files or --set on different ranks?)");
  const int64_t tags = Executor::max_tag(shape);
  if (tags > run.world.max_tag())
    throw SpecError(spec.origin("parallel.micro_batches") +
                    ": parallel.micro_batches = " + std::to_string(shape.micro_batches) + " needs message tags up to " +
                    std::to_string(tags) + " but this MPI allows " + std::to_string(run.world.max_tag()));
  if (spec.checkpoint.async && !run.world.threads_allowed())
    throw SpecError(spec.origin("checkpoint.async") +
                    ": checkpoint.async = true needs MPI_THREAD_FUNNELED (a writer "
                    "thread runs beside the one that calls MPI), which this MPI did not grant; set it to false");
  use_spec_device(spec, run.world.local_rank(), run.world.local_ranks());
  check_memory_fits(spec, run.layout.topo.stage, run.world.local_ranks());
}

// One BLAS thread per core this rank can have (more would fight the other ranks for cores),
// unless the spec or an explicit OPENBLAS_NUM_THREADS says otherwise; the element-wise kernels
// use the same cores.
void set_threads(const RunSpec& spec, const World& world, RunLayout& layout) {
  const char* env_threads = std::getenv("OPENBLAS_NUM_THREADS");
  layout.blas_threads = spec.parallel.threads_per_rank > 0 ? spec.parallel.threads_per_rank
                        : env_threads                      ? std::max(1, std::atoi(env_threads))
                                                           : world.cores_per_rank();
  set_blas_threads(layout.blas_threads);
  set_parallel_threads(layout.blas_threads);
}

// A fresh start from another model's weights (train.init_from): the source is opened and matched
// against the whole model on every rank alike (headers only), and its checksums, where it has
// them, checked in shares, before the model is allocated.
void open_init_source(const RunSpec& spec, const World& world, RunState& state) {
  state.init = std::make_unique<ModelImport>(spec.train.init_from, spec);
  const std::string problem = state.init->verify(world.rank(), world.size());
  if (!problem.empty()) throw SpecError(spec.origin("train.init_from") + ": train.init_from: " + problem);
}

// This rank's model slice and AdamW: initialised (or read from the train.init_from source), then
// loaded from the checkpoint if resuming.
void build_model(Run& run) {
  const RunSpec& spec = run.spec;
  const StepShape& shape = run.layout.shape;
  run.model.stage = std::make_unique<Stage>(
      spec, chunks_of(run.layout.blocks, shape.chunk_placement(), run.layout.topo.stage), shape.virtual_stages(),
      shape.micro_batches, shape.grad_scale(), TpPart{run.layout.topo.tp_rank, run.layout.topo.tp},
      TpPart{run.layout.topo.ep_rank(), run.layout.topo.ep});
  if (run.state.init) {
    run.world.require_agreed([&] {  // each rank reads only its own stage's tensors
      std::vector<float> host(run.model.stage->weights().size());
      run.state.init->load(run.model.stage->params(), host.data());
      run.model.stage->weights().assign(host.data(), host.size());
    });
    run.state.init_note = run.state.init->description();
    run.state.init.reset();  // closes the source's files
  } else {
    run.model.stage->init_params(static_cast<uint64_t>(spec.run.seed));
  }
  if (spec.data.document_mask)
    run.model.stage->set_document_mask({run.input.data->document_token(), spec.data.restart_positions});
  // ZeRO: this replica's row slabs; otherwise everything.
  const bool zero = spec.parallel.zero > 0;
  run.model.adam = std::make_unique<AdamW>(
      spec.train, OptimizerShard(run.model.stage->params(), zero ? run.layout.topo.dp_rank : 0,
                                 zero ? spec.parallel.dp : 1, spec.parallel.zero, spec.parallel.ep));
  if (!run.state.resumed_from.empty())
    run.state.start_step = load_checkpoint(run.state.resumed_from, *run.model.stage, *run.model.adam, run.world);
  if (run.model.adam->shard().shards_weights()) {  // ZeRO-3: the slabs kept, the whole given back
    run.model.adam->take_weights(run.model.stage->weights());
    run.model.stage->drop_weights();
  }
  run.state.last_saved = run.state.resumed_from.empty() ? -1 : run.state.start_step;
}

// MFU's denominators, fixed for the run. The peak is the hardware's: one core's FLOPs per cycle x
// clock (cpu_features), one GPU's datasheet peak (gpu::peak_gflops says which), or log.peak_gflops per
// rank where the user knows better. Beside it, the rate the BLAS reaches on square sgemm (one
// core's, one thread; one GPU's GEMM), so the share of what the library can do is known too. Both
// are found once per run, at its first launch, by each node's first rank alone (ranks sharing
// cores would measure each other), and kept in events.jsonl: a requeued launch reuses them, so MFU
// does not jump at a requeue with the noise of a new measurement. A job's figures are one unit's x
// the units it computes on: each node's ranks x BLAS threads, at most its cores (its GPUs).
void find_peaks(Run& run) {
  const RunSpec& spec = run.spec;
  if (run.opt.eval_only) return;
  const bool gpu = run.on_gpu();
  RecordedPeaks recorded = run.rank() == 0 ? recorded_peaks(run.state.run_dir, gpu, spec.model.dtype) : RecordedPeaks{};
  double unit[3] = {recorded.peak, recorded.sgemm, 0};  // {peak, sgemm, who measured}
  run.comms.comm->allreduce_world(unit, 2);
  run.telemetry.peak_basis =
      recorded.basis;  // rank 0 measures or reads the figures, and alone says how they were found
  if (unit[0] <= 0 || unit[1] <= 0) {
    unit[0] = unit[1] = 0;
    if (gpu) {
      const gpu::DeviceInfo info = gpu::device_info(compute_gpu());
      unit[0] = gpu::peak_gflops(info, spec.model.dtype);
      unit[1] = gpu::measure_gemm_gflops(spec.model.dtype);
      unit[2] = 1;
      run.telemetry.peak_basis = gpu::peak_basis(info, spec.model.dtype);
    } else if (run.world.local_rank() == 0) {
      set_blas_threads(1);
      const CorePeak core = core_peak(spec.model.dtype);
      unit[0] = core.gflops;
      unit[1] = spec.model.dtype == Dtype::bf16 ? measure_bf16_gemm_gflops() : measure_sgemm_gflops();
      unit[2] = 1;
      run.telemetry.peak_basis = core.basis;
      set_blas_threads(run.layout.blas_threads);
    }
    run.comms.comm->idle_barrier();  // the others wait asleep meanwhile: ranks polling on its core would slow the clock
                                     // it measures
    run.comms.comm->allreduce_world(unit, 3);
    unit[0] /= unit[2];
    unit[1] /= unit[2];  // the mean over the nodes (GPUs)
    if (unit[0] <= 0) {  // a CPU or GPU the tables do not know: the BLAS's rate is the best figure left
      unit[0] = unit[1];
      run.telemetry.peak_basis =
          "the measured GEMM rate: this " + std::string(gpu ? "GPU" : "CPU") + "'s FLOPs per cycle are unknown";
    }
  }
  run.telemetry.peak_per_unit = unit[0];
  run.telemetry.sgemm_per_unit = unit[1];
  double units = gpu ? 1.0
                 : run.world.local_rank() == 0
                     ? std::min(run.world.local_ranks() * run.layout.blas_threads, std::max(1, run.world.cores()))
                     : 0.0;
  run.comms.comm->allreduce_world(&units, 1);
  run.telemetry.peak_gflops = spec.log.peak_gflops > 0 ? spec.log.peak_gflops * run.world.size() : unit[0] * units;
  run.telemetry.sgemm_gflops = unit[1] * units;
}

// How world rank 0's clock reads against this rank's: ranks on rank 0's node read the same steady
// clock; others estimate its offset. Messages carry their send time on rank 0's clock with it.
double clock_offset_to_root(const World& world, Comm& comm) {
  const Comm::ClockOffset offset = comm.clock_offset_to_root(16, now_s);
  const std::vector<std::string>& hosts = world.hosts();
  return hosts[world.rank()] == hosts[0] ? 0.0 : offset.offset_s;
}

// The trace's time zero, as this rank's now_s() reads it: one instant of world rank 0's clock, so
// the spans of all ranks share one time base (a reference each rank took itself after a common
// reduction would differ by however long each was descheduled, milliseconds when ranks outnumber
// cores).
double trace_time_zero(const RunSpec& spec, Comm& comm, double clock_offset_s) {
  if (spec.log.trace_steps == 0) return now_s();
  return comm.broadcast_from_root(now_s()) - clock_offset_s;
}

// Straggler detection: every rank measures its windows, rank 0 compares them, knowing where each
// rank sits and what share of the pipeline's work its stage has (plan's cost model).
void prepare_straggler_detection(Run& run) {
  const RunSpec& spec = run.spec;
  if (spec.log.straggler_ratio <= 0) return;
  run.telemetry.straggler_window = std::make_unique<StragglerWindow>(spec.log.straggler_window, now_s());
  // Where ranks outnumber cores, a pass's wall time mostly says which rank the kernel's scheduler
  // let run: there the passes' CPU time is compared (the job's one choice, so all ranks compare alike).
  double overcommitted = run.world.local_ranks() * run.layout.blas_threads > run.world.cores() ? 1 : 0;
  run.comms.comm->allreduce_world(&overcommitted, 1);
  run.telemetry.straggler_cpu_time = overcommitted > 0;
  run.model.executor->time_cpu(run.telemetry.straggler_cpu_time);
  if (run.rank() != 0) return;
  std::vector<RankPlace> places;
  for (int r = 0; r < run.world.size(); ++r) {
    const Topology t =
        Topology::of(r, spec.parallel.pp, spec.parallel.dp, spec.parallel.order, false, spec.parallel.tp);
    places.push_back({t.stage, t.dp_rank, run.world.hosts()[r]});
  }
  std::vector<double> share;
  for (const StagePlan& s : make_plan(spec).stages) share.push_back(s.cost_share);
  run.telemetry.stragglers =
      std::make_unique<StragglerDetector>(places, share, spec.log.straggler_ratio, !run.telemetry.straggler_cpu_time);
  if (spec.log.straggler_action != StragglerAction::log)
    run.telemetry.straggler_policy =
        std::make_unique<StragglerPolicy>(spec, run.layout.blocks, run.layout.launch.spare_nodes);
}

// The schedule and everything the loop reads that does not change from step to step.
void prepare_steps(Run& run) {
  const RunSpec& spec = run.spec;
  const int T = spec.model.seq_len;
  run.model.executor = std::make_unique<Executor>(*run.model.stage, *run.comms.comm, run.layout.shape);
  run.telemetry.clock_offset_s = clock_offset_to_root(run.world, *run.comms.comm);
  run.model.executor->set_clock_offset(run.telemetry.clock_offset_s);
  run.model.actions = spec.parallel.schedule->generate(run.layout.topo.stage, spec.pipeline_shape());
  run.model.eval_actions = forward_only(run.model.actions);
  run.model.inputs.resize(static_cast<size_t>(spec.samples_per_micro_batch()) * T);
  run.model.targets.resize(run.model.inputs.size());
  find_peaks(run);
  run.telemetry.trace =
      Trace(spec.log.trace_steps, trace_time_zero(spec, *run.comms.comm, run.telemetry.clock_offset_s));
  run.telemetry.flops_per_step = training_flops_per_token(spec) * spec.train.global_batch * T;
  run.telemetry.tokens_per_step = static_cast<double>(spec.train.global_batch) * T;
  run.telemetry.bubble_theory = spec.parallel.schedule->bubble(spec.pipeline_shape());

  // The step boundary's sums. On the GPU gradients are summed over replicas through a host copy,
  // each bucket downloaded beside the backward as soon as it is final.
  Stage& stage = *run.model.stage;
  const ParamTensor* wte = stage.find("wte.weight");
  run.model.tied_wte = spec.model.tie_embeddings && run.layout.topo.tied_apart() ? wte : nullptr;
  // Gradients the tensor group sums: the norms' under sequence parallelism, a shared key/value head's.
  const bool tensor_sums = std::any_of(stage.params().begin(), stage.params().end(),
                                       [](const ParamTensor& p) { return p.sums_over_tokens || p.tp.shared(); });
  run.comms.grad_staging.resize(
      run.on_gpu() && (spec.parallel.dp > 1 || run.model.tied_wte || tensor_sums) ? stage.grads().size() : 0);
  const OptimizerShard& shard = run.model.adam->shard();
  run.comms.grad_shard_staging.resize(run.on_gpu() && shard.shards_grads() ? shard.state_floats() : 0);
  float* shard_out = !shard.shards_grads() ? nullptr
                     : run.on_gpu()        ? run.comms.grad_shard_staging.data()
                                           : run.model.adam->grad_shard().data();
  run.comms.grad_staging_pinned = HostPin(run.comms.grad_staging.data(), run.comms.grad_staging.size() * sizeof(float));
  run.comms.reducer = std::make_unique<GradReducer>(
      *run.comms.comm, stage.grads().data(), run.on_gpu() ? run.comms.grad_staging.data() : stage.grads().data(),
      stage.grads().size(), spec.comm.bucket_floats(), stage.params(), shard, run.model.tied_wte, shard_out);
  run.comms.param_staging.resize(run.on_gpu() && shard.sharded() ? stage.grads().size() : 0);  // (ZeRO-3 drops weights)
  run.comms.param_gather = std::make_unique<ParamGather>(
      *run.comms.comm, stage, shard, run.on_gpu() ? &run.comms.param_staging : nullptr, &run.telemetry.trace);
  if (shard.shards_weights()) {
    run.comms.layer_gather =
        std::make_unique<LayerGather>(*run.comms.comm, stage, *run.model.adam, spec.parallel.reshards_after_forward(),
                                      run.on_gpu() ? &run.comms.param_staging : nullptr, run.telemetry.trace);
    stage.set_weight_fetcher(run.comms.layer_gather.get());
  }

  run.telemetry.metrics = std::make_unique<MetricsWriter>(
      run.rank() == 0 && !run.opt.eval_only ? run.state.run_dir + "/metrics.jsonl" : "");
  run.policies.budget = std::make_unique<TimeBudget>(spec.run.time_limit, run.launched_s);
  run.policies.bad_steps = std::make_unique<BadSteps>(spec.train.max_bad_steps);
  prepare_straggler_detection(run);
}

// "pp 2 x dp 2, gpipe" (", 2 chunks per stage" when interleaved): how a layout is named in notes.
std::string layout_text(int tp, int pp, int dp, const std::string& schedule, int virtual_stages) {
  return grid_text(tp, pp, dp) + ", " + schedule +
         (virtual_stages > 1 ? ", " + std::to_string(virtual_stages) + " chunks per stage" : "");
}

// A manifest keeps spec values as TOML text: "\"gpipe\"" -> "gpipe".
std::string unquoted(const std::string& toml) {
  return toml.size() >= 2 && toml.front() == '"' && toml.back() == '"' ? toml.substr(1, toml.size() - 2) : toml;
}

}  // namespace

ExitCode start_up(Run& run) {
  World& world = run.world;
  const bool rank0 = world.rank() == 0, writes = !run.opt.eval_only;
  run.layout.launch = LaunchInfo::from_environment();
  if (ExitCode code = world.run_agreed([&] { read_spec_and_data(run); }); code != ExitCode::ok) return code;

  const RunSpec& spec = run.spec;
  run.comms.comm = std::make_unique<Comm>(world, run.layout.topo, spec.comm.wait, spec.comm.timeout_s);
  world.set_finalize(spec.comm.finalize, spec.comm.finalize_timeout_s);
  if (ExitCode code = world.run_agreed([&] { check_ranks_and_device(run); }); code != ExitCode::ok) return code;
  set_threads(run.spec, run.world, run.layout);

  run.state.run_dir = resolve_run_dir(run.opt.run_dir, spec);
  if (ExitCode code = world.run_agreed([&] {
        if (!rank0 || !writes) return;
        check_run_dir_is_a_run(run.state.run_dir);
        run.state.lock = std::make_unique<RunDirLock>(run.state.run_dir);
      });
      code != ExitCode::ok)
    return code;
  run.state.checkpointer = std::make_unique<Checkpointer>(spec, run.state.run_dir, *run.comms.comm);
  run.state.checkpointer->set_tokenizer(run.input.tokenizer_model);
  if (Mixture* mix = run.input.data ? run.input.data->mixture() : nullptr)
    run.state.checkpointer->set_source_tokens([&spec = run.spec, pattern = mix->pattern()](int64_t samples) {
      return tokens_by_source(spec, pattern, samples);
    });
  ResumeFrom from = run.opt.resume;
  from.model_only = run.opt.eval_only;  // eval reads the model; its data may be other data
  run.state.resumed_from = select_checkpoint(from, run.state.checkpointer->dir(), spec, world);
  if (!run.state.resumed_from.empty()) test_pause("resume");
  // init_from applies to a fresh start only: a requeued fine-tuning job resumes its own checkpoint.
  if (run.state.resumed_from.empty() && !spec.train.init_from.empty())
    if (ExitCode code = world.run_agreed([&] { open_init_source(run.spec, run.world, run.state); });
        code != ExitCode::ok)
      return code;
  build_model(run);

  // Only now, with every rank agreeing the run can start, touch the run directory.
  std::error_code ec;
  const bool own_history =
      !run.state.resumed_from.empty() &&
      fs::equivalent(fs::path(run.state.resumed_from).parent_path(), run.state.checkpointer->dir(), ec);
  if (ExitCode code = world.run_agreed([&] {
        if (rank0 && writes)
          run.state.run_dir_note =
              prepare_run_dir(run.state.run_dir, spec, own_history ? run.state.start_step : 0, *run.state.checkpointer,
                              run.input.tokenizer_model, &run.state.cut_log);
      });
      code != ExitCode::ok)
    return code;
  // The costs parallel.auto chose with stay with the run (written again after a fresh start has set
  // an earlier run's files aside).
  if (rank0 && run.state.auto_layout)
    write_file_atomically(run.state.run_dir + "/costs.json", run.state.auto_layout->costs_json);
  prepare_steps(run);
  return ExitCode::ok;
}

namespace {
// The start line's account of log.straggler_action.
std::string straggler_action_text(const RunSpec& spec, int spare_nodes) {
  const std::string k = std::to_string(spec.log.straggler_act_after);
  switch (spec.log.straggler_action) {
    case StragglerAction::exclude:
      return "; a node slow in " + k + " windows in a row is excluded (checkpoint, exit 3, requeued without it)" +
             (spare_nodes < 0 ? ", where the launcher says it can spare one (PIPETRAIN_SPARE_NODES: not set)"
              : spare_nodes > 0
                  ? ": the job can spare " + std::to_string(spare_nodes) + " node" + (spare_nodes > 1 ? "s" : "")
                  : ", but the job can spare none");
    case StragglerAction::rebalance:
      return "; a rank slow in " + k + " windows in a row gets fewer blocks (checkpoint, restart in-process)";
    default:
      return "";
  }
}
}  // namespace

void print_start(const Run& run) {
  if (run.rank() != 0) return;
  const RunSpec& spec = run.spec;
  const int threads = run.layout.blas_threads;
  std::printf(
      "%s: %d ranks = %s | M=%d micro-batches of %d | schedule %s | recompute %s | "
      "wait %s | %d BLAS thread%s per rank\n",
      version_string().c_str(), run.world.size(),
      grid_text(spec.parallel.tp, spec.parallel.pp, spec.parallel.dp).c_str(), spec.parallel.micro_batches,
      spec.samples_per_micro_batch(), schedule_description(spec).c_str(), name_of(spec.parallel.recompute),
      run.comms.comm->wait_mode() == WaitMode::yield ? "yield" : "spin", threads, threads == 1 ? "" : "s");
  std::printf("%s\n%s", run.layout.launch.describe().c_str(), node_map(run.world.hosts(), run.layout.topo).c_str());
  if (!run.opt.restart_note.empty()) std::printf("%s\n", run.opt.restart_note.c_str());
  if (const auto& pick = run.state.auto_layout)
    std::printf("layout chosen by parallel.auto: %s; %s; costs %s\n", pick->summary.c_str(), pick->reason.c_str(),
                pick->measured ? "measured at this launch, kept in RUN_DIR/costs.json"
                               : "from RUN_DIR/costs.json (measured at the run's first launch)");
  std::printf("partition (%s):\n%s", name_of(spec.parallel.partition),
              describe_partition(spec, run.layout.blocks).c_str());
  std::printf("run dir: %s%s%s\n", run.state.run_dir.c_str(), run.state.run_dir_note.empty() ? "" : " | ",
              run.state.run_dir_note.c_str());
  const char* unit = run.on_gpu() ? "GPU" : "core";
  char per_unit[96];
  std::snprintf(per_unit, sizeof per_unit, ", %.1f per %s x %.0f", run.telemetry.peak_per_unit, unit,
                run.telemetry.sgemm_gflops / run.telemetry.sgemm_per_unit);
  const std::string peak = spec.log.peak_gflops > 0 ? "log.peak_gflops x ranks" : run.telemetry.peak_basis + per_unit;
  const bool bf16 = spec.model.dtype == Dtype::bf16;
  std::printf(
      "peak %.1f GFLOP/s (%s) | %s %.1f GFLOP/s per %s | both fixed at the run's first launch | %.3g GFLOP per "
      "step\n",
      run.telemetry.peak_gflops, peak.c_str(), bf16 ? "bf16 GEMM" : "sgemm", run.telemetry.sgemm_per_unit, unit,
      run.telemetry.flops_per_step / 1e9);
  std::printf("%s%s%s\n", blas_description().c_str(), blas_kernel_decision().note.empty() ? "" : " | ",
              blas_kernel_decision().note.c_str());
  if (bf16 && !run.on_gpu()) std::printf("%s\n", bf16_products_line().c_str());
  if (!run.state.resumed_from.empty()) {
    std::printf("resumed from %s\n", run.state.resumed_from.c_str());
    const Manifest saved = Manifest::read(run.state.resumed_from);
    const std::string was = layout_text(
                          std::stoi(saved.spec_value("parallel.tp")), saved.pp, saved.dp,
                          saved.spec.count("parallel.schedule") ? unquoted(saved.spec.at("parallel.schedule")) : "?",
                          saved.virtual_stages),
                      now = layout_text(spec.parallel.tp, spec.parallel.pp, spec.parallel.dp,
                                        spec.parallel.schedule->name, spec.parallel.virtual_stages);
    if (was != now)
      std::printf("note: resumed on another layout: saved as %s, now %s (resharded)\n", was.c_str(), now.c_str());
    for (auto& change : changed_training_keys(saved, spec))
      std::printf("note: %s since the checkpoint (LR schedule / optimizer change from here on)\n", change.c_str());
  }
  if (!run.state.init_note.empty()) std::printf("%s\n", run.state.init_note.c_str());
  for (const std::string& note : spec.notes) std::printf("note: %s\n", note.c_str());
  if (spec.data.document_mask && run.input.data)
    std::printf("documents: attention within each document, a document beginning at token %d%s\n",
                run.input.data->document_token(), spec.data.restart_positions ? ", its positions counted from 0" : "");
  if (run.on_gpu() && run.model.adam->shard().shards_grads())
    std::printf(
        "note: parallel.zero = %d on the GPU keeps the whole gradient buffer on the device (a released range is "
        "zeroed, not freed), where plan counts what the CPU gives back\n",
        spec.parallel.zero);
  if (run.telemetry.stragglers)
    std::printf(
        "stragglers: a rank, node or link %gx slower than its peers in two windows (%d steps, %g s at least) in a "
        "row is reported%s%s\n",
        spec.log.straggler_ratio, spec.log.straggler_window, StragglerWindow::kMinWindowS,
        run.telemetry.straggler_cpu_time ? " (ranks outnumber cores: passes timed in CPU time, links not judged)" : "",
        straggler_action_text(spec, run.layout.launch.spare_nodes).c_str());
  if (run.state.start_step >= spec.run.steps)
    std::printf(
        "run already complete (%d steps): nothing to train; --set run.steps=N (N > %d) trains it further, "
        "a new run.name (or --run-dir) starts another run\n",
        spec.run.steps, spec.run.steps);
  std::fflush(stdout);
}

std::function<bool(int)> params_ready(const RunModel& model, RunComms& comms) {
  if (!model.adam->shard().sharded()) return nullptr;
  return [&comms](int chunk) { return comms.param_gather->wait(chunk); };
}

std::function<void(int)> inputs_from(const RunLayout& layout, RunModel& model, Dataset* data, int64_t index) {
  return [&layout, &model, data, index](int mb) {
    KernelTimer timer(Kernel::input);
    data->micro_batch(index, layout.topo.dp_rank, mb, model.inputs.data(), model.targets.data());
    if (model.stage->has_embedding()) model.stage->set_tokens(mb, model.inputs.data());
    if (model.stage->has_head()) model.stage->set_targets(mb, model.targets.data());
    model.stage->set_documents(mb, model.inputs.data());
  };
}

namespace {
// The mean token loss of the first `batches` global batches of `val` (null on a rank that reads no tokens).
double mean_loss(Run& run, Dataset* val, int64_t batches) {
  double loss = 0;
  for (int64_t batch = 0; batch < batches; ++batch)
    loss += run.model.executor
                ->run(run.model.eval_actions, run.telemetry.trace, inputs_from(run.layout, run.model, val, batch),
                      nullptr, params_ready(run.model, run.comms))
                .loss_sum;
  run.comms.comm->allreduce_world(&loss, 1);
  return loss / (static_cast<double>(batches) * run.telemetry.tokens_per_step);
}
}  // namespace

Validation evaluate(Run& run) {
  const RunSpec& spec = run.spec;
  Dataset* val = run.input.val.get();
  Validation v;
  v.loss = mean_loss(run, val, spec.eval.batches);
  if (spec.data.sources.size() > 1)
    for (int s = 0; s < static_cast<int>(spec.data.sources.size()); ++s) {
      const int64_t batches = std::min<int64_t>(spec.eval.batches, val->whole_batches(s));
      val->focus(s);
      v.by_source.push_back(batches > 0 ? mean_loss(run, val, batches) : -1);
      val->focus(-1);
    }
  if (run.comms.layer_gather) run.comms.layer_gather->release_all();
  run.telemetry.trace.take_exchange_s();  // an evaluation's gathers are not the next step's
  return v;
}

}  // namespace pipetrain
