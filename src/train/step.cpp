#include "pipetrain/train/step.hpp"

#include <cmath>
#include <cstdio>

#include "pipetrain/compute/bf16_products.hpp"
#include "pipetrain/compute/device.hpp"
#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/faults.hpp"

namespace pipetrain {
namespace {

// Test-only (PIPETRAIN_TEST_NAN): a NaN in this rank's gradient, as one arising in its backward
// would be (backward accumulates into it, the data-parallel all-reduce carries it to the stage's
// replicas). It goes into a tensor no other stage holds (the first one that is not wte: never the
// tied wte, whose exchange would carry it to the first stage): the other stages skip the update
// only because all ranks agree on it.
void poison_gradient(Stage& stage) {
  const float nan = NAN;
  for (const ParamTensor& p : stage.params())
    if (p.name != "wte.weight") return upload(stage.grads().data() + p.offset, &nan, sizeof nan);
}

// Each MoE block's routing over the step, summed over the ranks that ran it (a tensor group's
// first rank speaking for the group): rank 0's, empty elsewhere and without experts.
std::vector<RouterFigures> gather_routers(Run& run, const std::map<int, MoeBlockFigures>& routes) {
  const auto& moe = run.spec.model.moe;
  if (!moe.on()) return {};
  std::vector<int> blocks;
  for (int i = 0; i < run.spec.model.n_layer; ++i)
    if (moe.block_is_moe(i)) blocks.push_back(i);
  std::vector<double> mine(router_fields(blocks.size(), moe.experts), 0), all;
  if (run.layout.topo.tp_rank == 0)
    for (const auto& [block, f] : routes)
      pack_router_counts(blocks, moe.experts, block,
                         {f.chosen, f.dropped, f.aux_loss, f.z_loss, double(f.micro_batches)}, mine.data());
  run.comms.comm->gather_to_root(mine.data(), mine.size(), all);
  return run.rank() == 0 ? combine_router_counts(blocks, moe.experts, all) : std::vector<RouterFigures>{};
}

// What this rank measured over the step, as it travels to rank 0.
RankFigures rank_figures(Run& run, const StepResult& r) {
  RankFigures mine;
  mine.stage = run.layout.topo.stage;
  mine.dp_rank = run.layout.topo.dp_rank;
  mine.compute_s = r.stats.compute_s + r.local_s;
  mine.rank_step_s = r.step_s;
  const OptimizerShard& shard = run.model.adam->shard();
  // (The stage's whole count: ZeRO-3 drops the flat weights; the gradients' is the same.)
  const double whole = static_cast<double>(run.model.stage->grads().size()), slabs = shard.state_floats();
  mine.weight_floats = shard.shards_weights() ? slabs : whole;
  mine.grad_floats = shard.shards_grads() ? slabs : whole;
  mine.optim_floats = slabs;
  mine.comm_wait_s = r.waited_s;
  mine.bubble_wait_s = r.waited_s - r.dp_wait_s;
  mine.dp_wait_s = r.dp_wait_s;
  mine.dp_comm_s = r.dp_comm_s;
  mine.reduced_bytes = run.spec.parallel.dp > 1 ? 4 * whole : 0;
  mine.gathered_bytes = r.gathered_bytes;
  mine.act_peak_bytes = static_cast<double>(r.stats.act_peak_bytes);
  mine.p2p_bytes = static_cast<double>(r.stats.p2p_bytes);
  mine.mem_peak_bytes = peak_rss_bytes();
  mine.loss_sum = r.stats.loss_sum;
  mine.gpu_mem_bytes = static_cast<double>(gpu::memory_allocated());
  mine.gpu_mem_peak_bytes = static_cast<double>(gpu::memory_peak());
  mine.kernels = r.kernels;
  // Each replica's first stage reads its samples' inputs (tensor rank 0 counts them once).
  if (run.input.data && run.layout.topo.first_stage() && run.layout.topo.tp_rank == 0)
    mine.samples_digest = run.input.data->take_digest();
  if (run.telemetry.straggler_window && run.telemetry.straggler_window->closing())
    mine.window = run.telemetry.straggler_window->close(now_s());
  return mine;
}

// What rank 0 alone decides at the step boundary (`now`): whether the straggler window may close,
// and the straggler move to make after the step.
RootSays root_says(const Run& run, double now) {
  RootSays root;
  if (run.rank() != 0) return root;
  root.window_long_enough = run.telemetry.straggler_window && run.telemetry.straggler_window->long_enough(now);
  root.straggler_act = run.telemetry.straggler_move.kind;
  return root;
}

}  // namespace

StepResult train_step(Run& run, int step) {
  const RunSpec& spec = run.spec;
  Stage& stage = *run.model.stage;
  Comm& comm = *run.comms.comm;
  FaultHooks& faults = fault_hooks();
  StepResult r;
  const double t0 = now_s();
  faults.start_step(step);
  take_kernel_totals();      // count this step's kernels only
  stage.take_moe_figures();  // and its routing (an evaluation's forwards route too)
  run.telemetry.trace.set_step(step, step - static_cast<int>(run.state.start_step));
  r.lr = lr_at(spec, step);
  const OptimizerShard& shard = run.model.adam->shard();
  if (!shard.shards_grads()) stage.zero_grads();  // ZeRO-2, 3: released, and so zero, since the last step
  if (faults.fires(FaultPoint::nan_in_gradient)) poison_gradient(stage);
  r.local_s = now_s() - t0;
  faults.reach(FaultPoint::stall_at_step);
  comm.reset_wait_seconds();
  run.telemetry.trace.span("zero grads", "compute", t0, now_s());

  // The schedule; with replicas, gradient sums start during the last backward. With
  // ZeRO-1 each chunk's first forward waits for its weights, updated at the end of the last step.
  const bool replicas = spec.parallel.dp > 1;
  run.comms.reducer->begin_step();
  const std::function<void(size_t)> grads_done = [&](size_t offset) { run.comms.reducer->done_from(offset); };
  const Bf16WeightScope weight_copies(stage.weights().data(), stage.weights().size());  // (fp32: unused)
  r.stats = run.model.executor->run(
      run.model.actions, run.telemetry.trace, inputs_from(run.layout, run.model, run.input.data.get(), step),
      replicas ? grads_done : std::function<void(size_t)>(), params_ready(run.model, run.comms));
  if (run.comms.layer_gather) {  // ZeRO-3: the step's weights are used
    run.comms.layer_gather->release_all();
    r.gathered_bytes = run.comms.layer_gather->take_gathered_bytes();
  }

  // The step boundary carries the time budget's verdict, so every rank stops alike.
  const double sync_t0 = now_s();
  const bool out_of_time = run.policies.budget->nearly_out(sync_t0, sync_t0 - t0);
  r.sync = sync_step(stage, comm, *run.comms.reducer, *run.model.adam,
                     run.comms.grad_staging.empty() ? nullptr : &run.comms.grad_staging, out_of_time,
                     root_says(run, sync_t0), r.stats.loss_sum, run.telemetry.trace);
  if (shard.shards_grads()) stage.release_grads();  // the summed slabs are in the optimizer's compact copy
  const double opt_t0 = now_s();

  // A NaN/Inf anywhere skips the update on every rank alike: parameters and AdamW state stay as
  // they were, and the step's batch is simply not learned from.
  run.policies.bad_steps->record(r.sync.finite);
  if (r.sync.finite) {
    run.comms.param_gather->wait_all();  // (done already: every chunk ran a forward)
    run.model.adam->step(stage.params(), stage.weights(), stage.grads(), r.lr,
                         clip_coefficient(r.sync.norm, spec.train.grad_clip));
    r.gathered_bytes += run.comms.param_gather->post();
  } else if (run.rank() == 0) {
    std::printf("step %d: NaN or Inf in the loss or gradients; update skipped (%d in a row, %d this launch)\n",
                step + 1, run.policies.bad_steps->in_a_row(), run.policies.bad_steps->total());
  }
  run.telemetry.trace.span(r.sync.finite ? "optimizer" : "update skipped (non-finite)", "optimizer", opt_t0, now_s());
  r.local_s += now_s() - opt_t0 + r.sync.norm_s;
  r.step_s = now_s() - t0;
  run.policies.budget->step_took(r.step_s);
  r.waited_s = comm.wait_seconds();
  r.dp_wait_s = comm.data_wait_seconds();
  r.dp_comm_s = run.telemetry.trace.take_exchange_s();
  r.kernels = take_kernel_totals();
  r.routes = stage.take_moe_figures();
  if (run.telemetry.straggler_window) {
    // The rank's own time: the step less its waits for peers (its passes, its update, and whatever
    // held it up besides a peer: a throttled clock hits every part); where ranks outnumber cores,
    // the CPU time of its passes (observe/stragglers.hpp). The tensor group's collectives count as
    // waits: a slow tensor rank holds its peers up inside them, and they must not look slow too.
    const double tensor_s = r.kernels.seconds[static_cast<int>(Kernel::tp_comm)];
    run.telemetry.straggler_window->add_step(
        run.telemetry.straggler_cpu_time ? r.stats.compute_cpu_s : r.step_s - r.waited_s - tensor_s,
        r.waited_s + tensor_s, r.stats.transfer_s);
    if (r.sync.window_long_enough) run.telemetry.straggler_window->agree_to_close();
  }
  return r;
}

void log_step(Run& run, int done, const StepResult& r, const Validation& val) {
  const RankFigures mine = rank_figures(run, r);
  double packed[kRankFigureFields];
  mine.to(packed);
  std::vector<double> all;
  run.comms.comm->gather_to_root(packed, kRankFigureFields, all);
  std::vector<RouterFigures> routers = gather_routers(run, r.routes);
  if (run.rank() != 0) return;

  std::vector<RankFigures> figures;
  for (int rank = 0; rank < run.world.size(); ++rank)
    figures.push_back(RankFigures::from(&all[rank * kRankFigureFields]));
  StepLine line = combine(figures, run.spec.parallel.pp, run.telemetry.tokens_per_step);
  line.step = done;
  line.steps = run.spec.run.steps;
  line.lr = r.lr;
  line.grad_norm = r.sync.norm;
  line.time = wall_clock_s();
  line.launch = run.state.launch_index;
  line.arch = run.spec.model.arch;
  line.dtype = run.spec.model.dtype;
  line.routers = std::move(routers);
  line.tp = run.spec.parallel.tp;
  line.pp = run.spec.parallel.pp;
  line.dp = run.spec.parallel.dp;
  line.step_time_s = r.step_s;
  line.launch_totals = run.telemetry.totals;
  line.tokens_per_s = run.telemetry.tokens_per_step / r.step_s;
  line.skipped = !r.sync.finite;
  line.bad_steps = run.policies.bad_steps->total();
  line.bubble_theory = run.telemetry.bubble_theory;
  line.gflops = run.telemetry.flops_per_step / r.step_s / 1e9;
  line.peak_gflops = run.telemetry.peak_gflops;
  line.mfu = line.gflops / run.telemetry.peak_gflops;
  line.sgemm_gflops = run.telemetry.sgemm_gflops;
  line.sgemm_share = line.gflops / run.telemetry.sgemm_gflops;
  line.val_loss = val.loss;
  for (size_t s = 0; s < val.by_source.size(); ++s)
    if (val.by_source[s] >= 0) line.val_loss_by_source.emplace_back(run.spec.data.sources[s].name, val.by_source[s]);
  if (Mixture* mix = run.input.data ? run.input.data->mixture() : nullptr)  // rank 0 holds the first stage's data
    for (const auto& [name, tokens] :
         tokens_by_source(run.spec, mix->pattern(), int64_t{done} * run.spec.train.global_batch))
      line.tokens_by_source.emplace_back(name, static_cast<double>(tokens));
  std::vector<std::string> straggler_news;
  if (run.telemetry.stragglers && figures[0].window.steps > 0) {
    std::vector<WindowFigures> windows;
    for (const RankFigures& f : figures) windows.push_back(f.window);
    straggler_news = run.telemetry.stragglers->observe(windows, done);
    line.straggler_window = run.telemetry.stragglers->window_json();
    // A move decided here is made after the next step, which carries it to every rank.
    StragglerPolicy* policy = run.telemetry.straggler_policy.get();
    if (policy && run.telemetry.straggler_move.kind == StragglerAction::log) {
      run.telemetry.straggler_move = policy->after_window(*run.telemetry.stragglers, straggler_news);
      if (!run.telemetry.straggler_move.why.empty()) straggler_news.push_back(run.telemetry.straggler_move.why);
    }
  }
  run.telemetry.metrics->write(to_json(line));
  std::printf("%s\n", progress_line(line).c_str());
  for (const std::string& news : straggler_news) std::printf("%s\n", news.c_str());
  std::fflush(stdout);
}

}  // namespace pipetrain
