#include "pipetrain/train/train.hpp"

#include <unistd.h>

#include <csignal>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>

#include "pipetrain/compute/blas.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/ckpt/checkpoint.hpp"
#include "pipetrain/dist/comm.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/data/dataset.hpp"
#include "pipetrain/pipeline/executor.hpp"
#include "pipetrain/util/files.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/dist/launch.hpp"
#include "pipetrain/observe/metrics.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optim.hpp"
#include "pipetrain/compute/parallel_for.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/pipeline/plan.hpp"
#include "pipetrain/compute/profile.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/dist/signals.hpp"
#include "pipetrain/util/faults.hpp"
#include "pipetrain/observe/trace.hpp"
#include "pipetrain/train/grad_sync.hpp"

namespace fs = std::filesystem;

namespace pipetrain {
namespace {

// Moves `path` aside to path.N (first free N) and returns a note saying so.
std::string move_aside(const std::string& path) {
  std::error_code ec;
  int n = 1;
  while (fs::exists(path + "." + std::to_string(n), ec)) ++n;
  const std::string to = path + "." + std::to_string(n);
  fs::rename(path, to, ec);
  if (ec) throw SpecError(path + ": cannot move the previous one aside (" + ec.message() + ")");
  return "previous " + fs::path(path).filename().string() + " kept as " + fs::path(to).filename().string();
}

// Rank 0, once every rank agreed to start: creates the run directory and writes the resolved
// spec. Continuing this run's own history (resumed_step > 0 from its own checkpoints) keeps the
// log up to that step and sets aside newer checkpoints, whose steps are recomputed; otherwise (a
// fresh start, or a checkpoint of another run) an earlier log and checkpoints are moved aside.
std::string prepare_run_dir(const std::string& dir, const RunSpec& spec, int64_t resumed_step,
                            Checkpointer& checkpointer) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw SpecError("run dir " + dir + ": cannot create (" + ec.message() + ")");
  try {
    write_file_atomically(dir + "/config.toml", resolved_toml(spec));
  } catch (const std::runtime_error& e) {
    throw SpecError("run dir " + dir + ": cannot write config.toml (" + e.what() + ")");
  }
  const std::string metrics = dir + "/metrics.jsonl", checkpoints = dir + "/checkpoints";
  if (resumed_step > 0) {
    truncate_metrics(metrics, resumed_step);
    checkpointer.discard_newer_than(resumed_step);
    return "resumed at step " + std::to_string(resumed_step);
  }
  std::string note;
  if (fs::exists(metrics, ec)) note = move_aside(metrics);
  if (fs::exists(checkpoints, ec) && !fs::is_empty(checkpoints, ec))
    note += (note.empty() ? "" : "; ") + move_aside(checkpoints);
  // Find out now, not after the first hour of training, that checkpoints cannot be written.
  fs::create_directories(checkpoints, ec);
  if (!fs::is_directory(checkpoints))
    throw SpecError("checkpoint dir " + checkpoints + ": cannot create (" +
                    (fs::exists(checkpoints) ? std::string("a file of that name is in the way") : ec.message()) + ")");
  try {
    const std::string probe = checkpoints + "/.probe";
    write_file_atomically(probe, "");
    fs::remove(probe, ec);
  } catch (const std::runtime_error& e) {
    throw SpecError("checkpoint dir " + checkpoints + ": not writable (" + e.what() + ")");
  }
  return note;
}

// Refuses, before anything large is allocated, a model whose stage cannot fit in this rank's share
// of the node's memory, or of its GPU's when it computes on one (plan's prediction: parameters,
// gradients, AdamW, stashed activations, working buffers; on the GPU also attention backward's
// score gradients).
void check_memory_fits(const RunSpec& spec, int stage, int local_ranks) {
  const Plan plan = make_plan(spec);
  const StagePlan& s = plan.stages[stage];
  const int mode = static_cast<int>(spec.parallel.recompute);
  const bool on_gpu = compute_device() == Device::gpu;
  const double gib = 1024.0 * 1024 * 1024, state = 16.0 * s.params;  // 4 B weights + 4 B grads + 8 B AdamW
  const double T = spec.model.seq_len, attention_scratch = 4.0 * spec.samples_per_micro_batch() * spec.model.n_head * T * T;
  const double need = state + s.act_peak_bytes[mode] + s.working_bytes + (on_gpu ? attention_scratch : 0);
  const int sharing = on_gpu ? (local_ranks + gpu::device_count() - 1) / gpu::device_count() : local_ranks;
  const double share = (on_gpu ? gpu::memory_total() : node_memory_bytes()) / sharing;
  if (need <= share) return;
  char msg[512];
  std::snprintf(msg, sizeof msg,
                "the model does not fit: stage %d needs about %.1f GiB (parameters, gradients and AdamW %.1f GiB, "
                "activations under recompute = %s %.1f GiB), but each of the %d ranks on this %s has %.1f GiB; "
                "use more stages (parallel.pp), parallel.recompute, fewer or smaller micro-batches, or a smaller model",
                stage, need / gib, state / gib, name_of(spec.parallel.recompute), (need - state) / gib, sharing,
                on_gpu ? "GPU" : "node", share / gib);
  throw SpecError(msg);
}

// Gathers every rank's trace spans and rank 0 writes RUN_DIR/trace.json (collective).
void write_trace(const Trace& trace, Comm& comm, const std::string& run_dir) {
  std::vector<std::string> all;
  comm.gather_to_root(trace.events_json(comm.topo().stage, comm.topo().dp_rank), all);
  if (comm.topo().world_rank != 0) return;
  try {
    write_file_atomically(run_dir + "/trace.json", Trace::file_json(all, comm.topo()));
  } catch (const std::runtime_error& e) {  // a trace is not worth stopping training for
    std::fprintf(stderr, "pipetrain: warning: trace.json not written: %s\n", e.what());
  }
}

// Everything that can be wrong with the input, checked on every rank before anything large is
// allocated; the ranks then agree so all exit 2 together.
struct Setup {
  RunSpec spec;
  Topology topo;
  std::vector<int> blocks;
  std::unique_ptr<Dataset> data, val;  // val: when eval.every_steps > 0
  std::string run_dir, note;
};

}  // namespace

int run_train(const TrainOptions& opt) {
  const double launched = now_s();
  const int world = Comm::world_size(), rank = Comm::world_rank();
  install_stop_handlers();  // idempotent; main installs them before MPI_Init already
  const LaunchInfo launch = LaunchInfo::from_environment();
  Setup su;
  if (int code = Comm::run_agreed([&] {
        // srun without an MPI plugin starts N singletons that each see one rank: say so.
        if (launch.in_step && launch.ntasks > 1 && world == 1)
          throw SpecError("srun started " + std::to_string(launch.ntasks) +
                          " tasks but MPI sees 1 rank: launch with srun --mpi=pmi2 (MPICH)");
        su.spec = opt.eval_only && opt.config.empty() ? spec_of_checkpoint(opt.resume, opt.overrides, world)
                                                      : load_spec(opt.config, opt.overrides, world);
        if (opt.eval_only && su.spec.eval.every_steps == 0) su.spec.eval.every_steps = 1;  // load validation data
        su.topo = Topology::of(rank, su.spec.parallel.pp, su.spec.parallel.dp, su.spec.parallel.order);
        su.blocks = partition_blocks(su.spec);
        if (su.topo.first_stage() || su.topo.last_stage()) {
          su.data = std::make_unique<Dataset>(su.spec);
          if (su.spec.eval.every_steps > 0) su.val = std::make_unique<Dataset>(su.spec, Split::val);
        }
      }))
    return code;
  RunSpec& spec = su.spec;
  const Topology& topo = su.topo;
  const int P = spec.parallel.pp, D = spec.parallel.dp, M = spec.parallel.micro_batches;
  const int V = spec.parallel.virtual_stages;
  const int b = spec.samples_per_micro_batch(), T = spec.model.seq_len;

  Comm comm(topo, spec.comm.wait, spec.comm.timeout_s);
  Comm::set_finalize(spec.comm.finalize, spec.comm.finalize_timeout_s);
  if (int code = Comm::run_agreed([&] {
        const std::vector<int64_t> boundary = {b, T, spec.model.d_model, static_cast<int64_t>(sizeof(float))};
        if (!comm.all_equal(spec_hash(spec)) || !comm.boundary_agrees(boundary, boundary))
          throw SpecError("ranks disagree on the run spec or stage shapes (different files or --set on different ranks?)");
        const int64_t tags = Executor::max_tag(P * V, M);
        if (tags > Comm::max_tag())
          throw SpecError(spec.origin("parallel.micro_batches") + ": parallel.micro_batches = " + std::to_string(M) +
                          " needs message tags up to " + std::to_string(tags) + " but this MPI allows " +
                          std::to_string(Comm::max_tag()));
        if (spec.run.device == Device::gpu) {
          try {
            set_compute_device(Device::gpu, comm.local_rank());
          } catch (const std::runtime_error& e) {
            throw SpecError(spec.origin("run.device") + ": run.device = gpu: " + e.what());
          }
          gpu::set_matmul_dtype(spec.model.dtype);
        }
        check_memory_fits(spec, topo.stage, comm.local_ranks());
      }))
    return code;
  const bool on_gpu = compute_device() == Device::gpu;
  // One BLAS thread per core this rank can have (more would fight the other ranks for cores),
  // unless the spec or an explicit OPENBLAS_NUM_THREADS says otherwise.
  const char* env_threads = std::getenv("OPENBLAS_NUM_THREADS");
  const int blas_threads = spec.parallel.threads_per_rank > 0 ? spec.parallel.threads_per_rank
                           : env_threads                       ? std::max(1, std::atoi(env_threads))
                                                               : comm.cores_per_rank();
  set_blas_threads(blas_threads);
  set_parallel_threads(blas_threads);  // the element-wise kernels use the same cores

  su.run_dir = opt.run_dir.empty() ? spec.run.out_dir + "/" + spec.run.name : opt.run_dir;
  std::unique_ptr<RunDirLock> run_dir_lock;  // rank 0 holds it until the run ends
  if (int code = Comm::run_agreed([&] {
        if (rank == 0 && !opt.eval_only) run_dir_lock = std::make_unique<RunDirLock>(su.run_dir);
      }))
    return code;
  Checkpointer checkpointer(spec, su.run_dir, comm);
  const std::string resume_from = checkpointer.select(opt.resume);

  const float grad_scale = 1.0f / (static_cast<float>(b) * T * M * D);
  Stage stage(spec, chunks_of(su.blocks, P, topo.stage), P * V, M, grad_scale);
  stage.init_params(static_cast<uint64_t>(spec.run.seed));
  AdamW adam(spec.train, stage.weights().size());
  const int64_t start_step = resume_from.empty() ? 0 : checkpointer.load(resume_from, stage, adam);
  std::error_code ec;
  const bool own_history = !resume_from.empty() && fs::equivalent(fs::path(resume_from).parent_path(),
                                                                   checkpointer.dir(), ec);
  // Only now, with every rank agreeing the run can start, touch the run directory.
  if (int code = Comm::run_agreed([&] {
        if (rank == 0 && !opt.eval_only)
          su.note = prepare_run_dir(su.run_dir, spec, own_history ? start_step : 0, checkpointer);
      }))
    return code;

  Executor executor(stage, comm);
  const ActionList actions = spec.parallel.schedule->generate(topo.stage, spec.pipeline_shape());
  // MFU denominator: the job's peak, measured (all ranks at once, as they will run) or given.
  double peak_gflops = spec.log.peak_gflops > 0 || opt.eval_only ? spec.log.peak_gflops
                       : on_gpu                   ? gpu::measure_gemm_gflops()
                                                  : measure_sgemm_gflops();
  comm.allreduce_world(&peak_gflops, 1);
  Trace trace(spec.log.trace_steps, now_s());  // right after a world-wide reduction: a common start
  const int trace_last = static_cast<int>(start_step) + std::min(spec.log.trace_steps, spec.run.steps - static_cast<int>(start_step));
  const double flops_per_step = training_flops_per_token(spec) * spec.train.global_batch * T;
  const double bubble_theory = spec.parallel.schedule->bubble(spec.pipeline_shape());
  const double tokens_per_step = static_cast<double>(spec.train.global_batch) * T;

  const size_t mb_tokens = static_cast<size_t>(b) * T;
  std::vector<int> inputs(mb_tokens), targets(mb_tokens);
  // The executor's load_inputs for batch `index` of `data` (null on the middle stages, which never
  // load): tokens and targets of a micro-batch are read just before its forward, so they live only
  // as long as its other activations.
  const auto inputs_from = [&](Dataset* data, int64_t index) {
    return [&, data, index](int mb) {
      data->micro_batch(index, topo.dp_rank, mb, inputs.data(), targets.data());
      if (stage.has_embedding()) stage.set_tokens(mb, inputs.data());
      if (stage.has_head()) stage.set_targets(mb, targets.data());
    };
  };
  // Validation: the schedule's forwards alone over eval.batches fixed global batches of held-out
  // samples; the mean token loss over all of them, the same on every rank and any layout.
  const ActionList eval_actions = forward_only(actions);
  const auto evaluate = [&] {
    double loss = 0;
    for (int batch = 0; batch < spec.eval.batches; ++batch) {
      loss += executor.run(eval_actions, M, trace, inputs_from(su.val.get(), batch)).loss_sum;
    }
    comm.allreduce_world(&loss, 1);
    return loss / (static_cast<double>(spec.eval.batches) * tokens_per_step);
  };

  if (opt.eval_only) {
    const double val_loss = evaluate();
    if (rank == 0)
      std::printf("%s: step %lld, val_loss %.6f over %d batches of %d samples x %d tokens (pp %d x dp %d)\n",
                  resume_from.c_str(), static_cast<long long>(start_step), val_loss, spec.eval.batches,
                  spec.train.global_batch, T, P, D);
    return 0;
  }
  if (rank == 0) {
    const std::string schedule = schedule_description(spec);
    std::printf("pipetrain: %d ranks = pp %d x dp %d | M=%d micro-batches of %d | schedule %s | recompute %s | "
                "wait %s | %d BLAS thread%s per rank\n",
                world, P, D, M, b, schedule.c_str(), name_of(spec.parallel.recompute),
                comm.wait_mode() == WaitMode::yield ? "yield" : "spin", blas_threads, blas_threads == 1 ? "" : "s");
    std::printf("%s\n%s", launch.describe().c_str(), node_map(comm.hosts(), topo).c_str());
    std::printf("partition (%s):\n%s", name_of(spec.parallel.partition), describe_partition(spec, su.blocks).c_str());
    std::printf("run dir: %s%s%s\n", su.run_dir.c_str(), su.note.empty() ? "" : " | ", su.note.c_str());
    std::printf("peak %.1f GFLOP/s (%s), %.3g GFLOP per step | %s\n", peak_gflops,
                spec.log.peak_gflops > 0 ? "log.peak_gflops x ranks" : "measured sgemm, all ranks", flops_per_step / 1e9,
                blas_description().c_str());
    if (!resume_from.empty()) {
      std::printf("resumed from %s\n", resume_from.c_str());
      for (auto& change : changed_training_keys(Manifest::read(resume_from), spec))
        std::printf("note: %s since the checkpoint (LR schedule / optimizer change from here on)\n", change.c_str());
    }
    if (start_step >= spec.run.steps) std::printf("run already complete (%d steps)\n", spec.run.steps);
    std::fflush(stdout);
  }
  MetricsWriter metrics(rank == 0 ? su.run_dir + "/metrics.jsonl" : "");

  const size_t bucket = std::max<size_t>(1, static_cast<size_t>(spec.comm.bucket_mb * (1 << 20) / sizeof(float)));
  const ParamTensor* wte = stage.find("wte.weight");
  const bool tied_sync = spec.model.tie_embeddings && P > 1 && wte != nullptr;
  // GPU: gradients are summed over replicas through a host copy after the step (no overlap yet).
  std::vector<float> grad_staging(on_gpu && (D > 1 || tied_sync) ? stage.grads().size() : 0);
  GradReducer reducer(comm, on_gpu ? grad_staging : stage.grads().host(), bucket);
  const std::function<void(size_t)> grads_done = [&](size_t offset) { reducer.done_from(offset); };

  // Start-up is over: a rank that stops answering is found within comm.timeout_s wherever it stops.
  const auto bound_step_agreements = [&] { Comm::bound_agreements(spec.comm.timeout_s, "a step agreement; comm.timeout_s"); };
  bound_step_agreements();
  bool saved_before = false;
  const int stall_at_step = test_stall_step(rank);
  double max_step_s = 0, max_save_s = 1.0, max_eval_s = 0;  // for the time budget (1 s: a save not yet seen)
  int bad_steps = 0, bad_in_a_row = 0;      // steps skipped for a NaN/Inf loss or gradient
  int64_t last_saved = resume_from.empty() ? -1 : start_step;
  for (int step = static_cast<int>(start_step); step < spec.run.steps; ++step) {
    const double t0 = now_s();
    take_kernel_totals();  // count this step's kernels only
    trace.set_step(step, step - static_cast<int>(start_step));
    const double lr = lr_at(spec, step);
    double local_s = -now_s();  // compute outside the executor: zeroing, optimizer
    stage.zero_grads();
    // test-only: a NaN in this rank's gradient, as one arising in its backward would be (backward
    // accumulates into it, the data-parallel all-reduce carries it to the stage's replicas). It
    // goes into a tensor no other stage holds (wpe on the first stage, else the first tensor;
    // never the tied wte, whose exchange would carry it to the first stage): the other stages
    // skip the update only because all ranks agree on it.
    if (test_nan_at(rank, step)) {
      const float nan = NAN;
      const ParamTensor* wpe = stage.find("wpe.weight");
      upload(stage.grads().data() + (wpe ? wpe->offset : 0), &nan, sizeof nan);
    }
    local_s += now_s();
    if (step == stall_at_step) raise(SIGSTOP);  // test-only: this rank stops answering
    comm.reset_wait_seconds();
    trace.span("zero grads", "compute", t0, now_s());
    reducer.begin_step();
    const auto load_inputs = inputs_from(su.data.get(), step);
    const StepStats st =
        executor.run(actions, M, trace, load_inputs, D > 1 && !on_gpu ? grads_done : std::function<void(size_t)>());
    const double sync_t0 = now_s();

    // run.time_limit: stop while one more step and a checkpoint still fit in the budget.
    const double worst_step = std::max(max_step_s, now_s() - t0);
    const bool out_of_time = spec.run.time_limit > 0 && now_s() - launched + 1.5 * worst_step + 1.5 * max_save_s +
                                                          1.5 * max_eval_s >= spec.run.time_limit;
    const StepSync sync =
        sync_step(stage, comm, D > 1 ? &reducer : nullptr, on_gpu ? &grad_staging : nullptr, tied_sync ? wte : nullptr,
                  out_of_time, st.loss_sum);
    const double opt_t0 = now_s();
    trace.span(topo.dp > 1 ? "gradient all-reduce + norm" : "gradient norm", "comm", sync_t0, opt_t0);
    // A NaN/Inf anywhere skips the update on every rank alike: parameters and AdamW state stay as
    // they were, and the step's batch is simply not learned from.
    if (sync.finite && test_kill_in_optimizer(rank, step)) {  // test-only: die with half the tensors updated
      const std::vector<ParamTensor> half(stage.params().begin(), stage.params().begin() + stage.params().size() / 2);
      adam.step(half, stage.weights(), stage.grads(), lr, 1.f);
      raise(SIGKILL);
    }
    if (sync.finite) {
      adam.step(stage.params(), stage.weights(), stage.grads(), lr, clip_coefficient(sync.norm, spec.train.grad_clip));
      bad_in_a_row = 0;
    } else {
      ++bad_steps, ++bad_in_a_row;
      if (rank == 0)
        std::printf("step %d: NaN or Inf in the loss or gradients; update skipped (%d in a row, %d this launch)\n",
                    step + 1, bad_in_a_row, bad_steps);
    }
    trace.span(sync.finite ? "optimizer" : "update skipped (non-finite)", "optimizer", opt_t0, now_s());
    local_s += now_s() - opt_t0 + sync.norm_s;
    const double step_time = now_s() - t0;
    max_step_s = std::max(max_step_s, step_time);
    const double waited = comm.wait_seconds();  // before the step-boundary agreement and any save
    const KernelTotals step_kernels = take_kernel_totals();

    // Step boundary: ranks agreed on a stop signal in sync_step; evaluate if due, log (before
    // saving, so a checkpoint never covers a step missing from the log) and save if due.
    const int done = step + 1;
    const bool stop = sync.stop;
    // not when stopping early: the checkpoint comes first
    const bool eval_due = spec.eval.every_steps > 0 && (done % spec.eval.every_steps == 0 || done == spec.run.steps) &&
                          !(stop && done < spec.run.steps);
    double val_loss = -1;
    if (eval_due) {
      const double eval_t0 = now_s();
      val_loss = evaluate();
      trace.span("evaluation", "compute", eval_t0, now_s());
      max_eval_s = std::max(max_eval_s, now_s() - eval_t0);
    }
    if ((done % spec.log.every_steps == 0 || done == spec.run.steps || stop || eval_due)) {
      RankFigures mine;
      mine.stage = topo.stage, mine.dp_rank = topo.dp_rank, mine.compute_s = st.compute_s + local_s;
      mine.rank_step_s = step_time;
      mine.param_count = static_cast<double>(stage.weights().size());
      mine.comm_wait_s = waited;
      mine.bubble_wait_s = waited - sync.dp_wait_s;
      mine.act_peak_bytes = static_cast<double>(st.act_peak_bytes);
      mine.mem_peak_bytes = peak_rss_bytes();
      mine.loss_sum = st.loss_sum;
      mine.gpu_mem_bytes = static_cast<double>(gpu::memory_allocated());
      mine.gpu_mem_peak_bytes = static_cast<double>(gpu::memory_peak());
      mine.kernels = step_kernels;
      double packed[RankFigures::kFields];
      mine.to(packed);
      std::vector<double> all;
      comm.gather_to_root(packed, RankFigures::kFields, all);
      if (rank == 0) {
        std::vector<RankFigures> figures;
        for (int r = 0; r < world; ++r) figures.push_back(RankFigures::from(&all[r * RankFigures::kFields]));
        StepLine line = combine(figures, P, tokens_per_step);
        line.step = done, line.steps = spec.run.steps, line.lr = lr, line.grad_norm = sync.norm;
        line.step_time_s = step_time, line.tokens_per_s = tokens_per_step / step_time;
        line.skipped = !sync.finite, line.bad_steps = bad_steps;
        line.bubble_theory = bubble_theory;
        line.gflops = flops_per_step / step_time / 1e9;
        line.peak_gflops = peak_gflops;
        line.mfu = line.gflops / peak_gflops;
        line.val_loss = val_loss;
        metrics.write(to_json(line));
        std::printf("%s\n", progress_line(line).c_str());
        std::fflush(stdout);
      }
    }
    const int every = spec.checkpoint.every_steps;
    if (stop || done == spec.run.steps || (every > 0 && done % every == 0)) {
      const double save_t0 = now_s();
      // A save's agreements wait for the slowest shard writer: comm.timeout_s beyond 4x the
      // longest save so far (at least 1 s; the first save keeps start-up's bound).
      Comm::bound_agreements(saved_before ? spec.comm.timeout_s + 4 * max_save_s : Comm::kStartupAgreementS,
                             "a checkpoint save; comm.timeout_s + 4x the longest save");
      try {
        const double secs = checkpointer.save(done, stage, adam, su.blocks);
        last_saved = done;
        if (rank == 0 && secs > 0) std::printf("checkpoint step %d saved in %.2f s\n", done, secs);
      } catch (const AgreedExit&) {  // every rank is here; the failing rank said why
        const bool last_chance = stop || done == spec.run.steps;
        const std::string kept = last_saved >= 0 ? "the latest checkpoint, step " + std::to_string(last_saved) + ", is intact"
                                                 : "no checkpoint of this run exists yet";
        if (last_chance || spec.checkpoint.on_error == OnSaveError::stop) {
          if (rank == 0)
            std::fprintf(stderr, "pipetrain: error: checkpoint step %d not saved; %s; stopping (%s)\n", done,
                         kept.c_str(), last_chance ? "it was the run's last save" : "checkpoint.on_error = stop");
          return 1;
        }
        if (rank == 0)
          std::fprintf(stderr, "pipetrain: warning: checkpoint step %d not saved; %s; training continues "
                       "(checkpoint.on_error = warn)\n", done, kept.c_str());
      }
      trace.span("checkpoint", "checkpoint", save_t0, now_s());
      max_save_s = std::max(max_save_s, now_s() - save_t0);
      saved_before = true;
      bound_step_agreements();
    }
    if (done == trace_last || (stop && done < trace_last)) write_trace(trace, comm, su.run_dir);
    if (bad_in_a_row >= spec.train.max_bad_steps) {  // every rank counts alike: all leave together
      if (rank == 0)
        std::fprintf(stderr,
                     "pipetrain: error: %d consecutive steps (%d to %d) had NaN or Inf in the loss or gradients "
                     "(train.max_bad_steps = %d); stopping. Parameters are those from before step %d%s\n",
                     bad_in_a_row, done - bad_in_a_row + 1, done, spec.train.max_bad_steps, done - bad_in_a_row + 1,
                     last_saved >= 0 ? ("; the latest checkpoint is step " + std::to_string(last_saved)).c_str() : "");
      return 1;
    }
    if (stop && done < spec.run.steps) {  // on the last step the run is simply complete
      if (rank == 0) {
        if (stop_signal()) std::printf("stopped by signal %d after step %d; checkpoint saved, exit 3\n", stop_signal(), done);
        else std::printf("time budget run.time_limit = %g s nearly used after step %d; checkpoint saved, exit 3\n",
                         spec.run.time_limit, done);
      }
      return 3;
    }
  }
  return 0;
}

}  // namespace pipetrain
