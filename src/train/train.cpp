#include "pipetrain/train/train.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "pipetrain/dist/signals.hpp"
#include "pipetrain/train/run.hpp"
#include "pipetrain/train/run_history.hpp"
#include "pipetrain/train/step.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/faults.hpp"

namespace pipetrain {
namespace {

// `pipetrain eval`: the checkpoint's validation loss on this layout; writes nothing.
ExitCode evaluate_checkpoint(Run& run) {
  const Validation val = evaluate(run);
  const RunSpec& spec = run.spec;
  if (run.rank() != 0) return ExitCode::ok;
  std::printf("%s: step %lld, val_loss %.6f over %d batches of %d samples x %d tokens (%s)\n",
              run.state.resumed_from.c_str(), static_cast<long long>(run.state.start_step), val.loss, spec.eval.batches,
              spec.train.global_batch, spec.model.seq_len,
              grid_text(spec.parallel.tp, spec.parallel.pp, spec.parallel.dp).c_str());
  for (size_t s = 0; s < val.by_source.size(); ++s) {
    const std::string& name = spec.data.sources[s].name;
    if (val.by_source[s] < 0) std::printf("  %s: its held-out windows hold no whole batch\n", name.c_str());
    else std::printf("  %s: val_loss %.6f\n", name.c_str(), val.by_source[s]);
  }
  return ExitCode::ok;
}

// The validation losses, timed for the trace and the time budget.
Validation timed_evaluate(Run& run) {
  TimedInto counted{run.telemetry.totals.eval_s};
  const double t0 = now_s();
  const Validation val = evaluate(run);
  run.telemetry.trace.span("evaluation", "compute", t0, now_s());
  run.policies.budget->eval_took(now_s() - t0);
  return val;
}

// How a launch ends by its own decision, and why (the stop record's reason in events.jsonl).
struct Ending {
  ExitCode code;
  const char* reason;    // complete, signal, time_limit, bad_steps, failed_save, straggler_exclude, straggler_rebalance
  bool restart = false;  // straggler_rebalance: the process goes on with another launch
};

// A save of step `step` that failed (every rank is here; the failing rank said why): the run ends
// (exit 1) when it was the last one or checkpoint.on_error = stop; otherwise training goes on and
// the next save tries again.
std::optional<Ending> failed_save(Run& run, int64_t step, bool last_chance) {
  const std::string kept = run.state.last_saved >= 0
                               ? "the latest checkpoint, step " + std::to_string(run.state.last_saved) + ", is intact"
                               : "no checkpoint of this run exists yet";
  if (stop_after_failed_save(run.spec, last_chance)) {
    if (run.rank() == 0)
      report_error("checkpoint step " + std::to_string(step) + " not saved; " + kept + "; stopping (" +
                   (last_chance ? "it was the run's last save" : "checkpoint.on_error = stop") + ")");
    return Ending{ExitCode::fault, "failed_save"};
  }
  if (run.rank() == 0)
    std::fprintf(stderr,
                 "pipetrain: warning: checkpoint step %lld not saved; %s; training continues "
                 "(checkpoint.on_error = warn)\n",
                 static_cast<long long>(step), kept.c_str());
  return std::nullopt;
}

// The end of an asynchronous save, however it went.
std::optional<Ending> background_save_ended(Run& run, const Checkpointer::Outcome& out, bool last_chance) {
  run.policies.budget->save_took(out.seconds);  // a stop must leave time for a whole save
  if (!out.saved) return failed_save(run, out.step, last_chance);
  run.state.last_saved = out.step;
  if (run.rank() == 0)
    std::printf("checkpoint step %lld saved in %.2f s (written in the background)\n", static_cast<long long>(out.step),
                out.seconds);
  return std::nullopt;
}

// Moves background saves on (collective, at step boundaries) as far as `until` says. `last_save`:
// the step of the run's last save, whose failure ends the run (-1: none).
std::optional<Ending> advance_save(Run& run, Checkpointer::Until until, int64_t last_save = -1) {
  if (!run.state.checkpointer->saving()) return std::nullopt;
  TimedInto counted{run.telemetry.totals.checkpoint_s};
  World::LongerAgreements saving(
      run.world, run.policies.budget->save_agreement_s(run.spec.comm.timeout_s, World::kStartupAgreementS),
      "a checkpoint save; comm.timeout_s + 4x the longest save");
  std::vector<Checkpointer::Outcome> outs = run.state.checkpointer->advance(until);
  // A failed save may end while an earlier one is still being checksummed or published: let the
  // others end first, so the failure names the checkpoint a resume would really find.
  auto failed = [](const Checkpointer::Outcome& o) { return !o.saved; };
  if (std::any_of(outs.begin(), outs.end(), failed)) {
    const std::vector<Checkpointer::Outcome> rest = run.state.checkpointer->advance(Checkpointer::Until::all_ended);
    outs.insert(outs.end(), rest.begin(), rest.end());
    std::sort(outs.begin(), outs.end(), [](auto& a, auto& b) { return a.step < b.step; });
  }
  std::optional<Ending> end;
  for (const Checkpointer::Outcome& out : outs)
    if (std::optional<Ending> e = background_save_ended(run, out, out.step == last_save); e && !end) end = e;
  return end;
}

// Checkpoint `done` when due. A save's agreements may wait for the slowest shard writer longer
// than a step's. With checkpoint.async the save before must be written first (its publication
// may go on); training waits only for the snapshot, except at the run's last save, which is
// waited for to the end.
std::optional<Ending> maybe_save(Run& run, int done, bool stopping) {
  const RunSpec& spec = run.spec;
  if (!save_due(spec, done, stopping)) return std::nullopt;
  const bool last_chance = stopping || done == spec.run.steps;
  if (std::optional<Ending> end = advance_save(run, Checkpointer::Until::room)) return end;
  const double t0 = now_s();
  World::LongerAgreements saving(run.world,
                                 run.policies.budget->save_agreement_s(spec.comm.timeout_s, World::kStartupAgreementS),
                                 "a checkpoint save; comm.timeout_s + 4x the longest save");
  try {
    if (spec.checkpoint.async) {
      {
        TimedInto counted{run.telemetry.totals.checkpoint_s};
        run.state.checkpointer->start_save(done, *run.model.stage, *run.model.adam, run.layout.blocks);
      }
      run.telemetry.trace.span("checkpoint snapshot", "checkpoint", t0, now_s());
      if (last_chance) return advance_save(run, Checkpointer::Until::all_ended, done);
      return std::nullopt;
    }
    const double secs = run.state.checkpointer->save(done, *run.model.stage, *run.model.adam, run.layout.blocks);
    run.state.last_saved = done;
    if (run.rank() == 0 && secs > 0) std::printf("checkpoint step %d saved in %.2f s\n", done, secs);
  } catch (const AgreedExit&) {  // every rank is here; the failing rank said why
    if (std::optional<Ending> end = failed_save(run, done, last_chance)) return end;
  }
  run.telemetry.trace.span("checkpoint", "checkpoint", t0, now_s());
  run.policies.budget->save_took(now_s() - t0);
  run.telemetry.totals.checkpoint_s += now_s() - t0;
  return std::nullopt;
}

// After step `done` (everything logged and saved): how the run ends now, if it does. Every rank
// holds the same counts and the same agreed stop flag, so all leave together.
std::optional<Ending> should_stop(Run& run, int done, bool stopping) {
  const RunSpec& spec = run.spec;
  const BadSteps& bad = *run.policies.bad_steps;
  if (bad.too_many()) {
    const int first = done - bad.in_a_row() + 1;
    if (run.rank() == 0)
      report_error(
          std::to_string(bad.in_a_row()) + " consecutive steps (" + std::to_string(first) + " to " +
          std::to_string(done) + ") had NaN or Inf in the loss or gradients (train.max_bad_steps = " +
          std::to_string(spec.train.max_bad_steps) + "); stopping. Parameters are those from before step " +
          std::to_string(first) +
          (run.state.last_saved >= 0 ? "; the latest checkpoint is step " + std::to_string(run.state.last_saved) : ""));
    return Ending{ExitCode::fault, "bad_steps"};
  }
  if (!stopping || done == spec.run.steps) return std::nullopt;  // on the last step the run is simply complete
  if (run.rank() == 0) {
    if (stop_signal())
      std::printf("stopped by signal %d after step %d; checkpoint saved, exit 3\n", stop_signal(), done);
    else
      std::printf("time budget run.time_limit = %g s nearly used after step %d; checkpoint saved, exit 3\n",
                  spec.run.time_limit, done);
  }
  return Ending{ExitCode::stopped, stop_signal() ? "signal" : "time_limit"};
}

// The straggler move every rank learned from the step after `done` (train/straggler_action.hpp),
// made now that the step is logged and saved: exclude stops (exit 3) for the job script to requeue
// without the slow nodes; rebalance ends this launch for an in-process restart on a new partition.
Ending straggler_ending(Run& run, StragglerAction act, int done) {
  const StragglerMove& move = run.telemetry.straggler_move;  // rank 0's
  if (act == StragglerAction::exclude) {
    if (run.rank() == 0) {
      std::string nodes;
      for (const std::string& n : move.nodes) nodes += (nodes.empty() ? "" : ",") + n;
      std::printf("stopped after step %d to exclude straggling node %s; checkpoint saved, exit 3\n", done,
                  nodes.c_str());
    }
    return {ExitCode::stopped, "straggler_exclude"};
  }
  if (run.rank() == 0)
    std::printf("stopped after step %d to rebalance; checkpoint saved, restarting on partition %s\n", done,
                blocks_text(move.blocks).c_str());
  return {ExitCode::stopped, "straggler_rebalance", true};
}

// Rank 0 records how the launch ended; every rank returns its code. A background save still in
// flight (the run ends otherwise than at a save) is waited for first. The record carries where the
// launch's time went, and a straggler stop's what it acted on: the nodes to exclude, or the
// partition to restart on.
ExitCode finish(Run& run, Ending ending, int64_t step) {
  run.comms.param_gather->wait_all();  // no collective may be left in flight at MPI_Finalize
  if (std::optional<Ending> failed = advance_save(run, Checkpointer::Until::all_ended);
      failed && (ending.code == ExitCode::ok || ending.restart))
    ending = *failed;
  if (run.rank() == 0) {
    nlohmann::json extra = {{"launch_totals", run.telemetry.totals.to_json()}};
    const StragglerMove& move = run.telemetry.straggler_move;
    if (ending.reason == std::string("straggler_exclude")) extra["exclude_nodes"] = move.nodes;
    if (ending.restart) extra["partition"] = {{"from", run.layout.blocks}, {"to", move.blocks}, {"why", move.why}};
    record_stop(run.state, ending.reason, ending.code, step, extra);
  }
  if (!ending.restart) test_pause("exit");
  return ending.restart ? ExitCode::ok : ending.code;
}

// One launch of the run on `world`: start-up, then steps until the run ends, stops, or (`restart`
// set) a rebalance restarts it on the partition `restart` names.
ExitCode run_launch(const TrainOptions& opt, World& world, double launched_s, double started_unix,
                    std::vector<int>& restart) {
  Run run(world, opt);
  run.launched_s = launched_s;
  run.started_unix = started_unix;
  if (ExitCode code = start_up(run); code != ExitCode::ok) return code;
  if (opt.eval_only) return evaluate_checkpoint(run);
  print_start(run);
  if (run.rank() == 0) run.state.launch_index = record_launch(run);

  const RunSpec& spec = run.spec;
  const int first = static_cast<int>(run.state.start_step);
  const int trace_last = first + std::min(spec.log.trace_steps, spec.run.steps - first);
  // Start-up is over: a rank that stops answering is found within comm.timeout_s wherever it stops.
  world.bound_agreements(spec.comm.timeout_s, "a step agreement; comm.timeout_s");
  for (int step = first; step < spec.run.steps; ++step) {
    const StepResult result = train_step(run, step);
    run.telemetry.totals.steps_s += result.step_s;
    // The ranks agreed on stopping in the step; evaluate if due, log (before saving, so a
    // checkpoint never covers a step missing from the log), save if due.
    const int done = step + 1;
    if (std::optional<Ending> failed = advance_save(run, Checkpointer::Until::one_round))
      return finish(run, *failed, done);
    // A straggler move stops the launch after this step, saved like a stop (the run's last step just ends it).
    const bool acting = result.sync.straggler_act != StragglerAction::log && done < spec.run.steps;
    const bool stopping = result.sync.stop || acting;
    const bool evaluating = eval_due(spec, done, result.sync.stop);
    const Validation val = evaluating ? timed_evaluate(run) : Validation{};
    if (log_due(spec, done, stopping, evaluating)) log_step(run, done, result, val);
    if (std::optional<Ending> failed = maybe_save(run, done, stopping)) return finish(run, *failed, done);
    if (done == trace_last || (stopping && done < trace_last))
      write_trace(run.telemetry.trace, *run.comms.comm, run.state.run_dir);
    if (std::optional<Ending> end = should_stop(run, done, result.sync.stop)) return finish(run, *end, done);
    if (acting) {
      const Ending ending = straggler_ending(run, result.sync.straggler_act, done);
      const ExitCode code = finish(run, ending, done);
      if (ending.restart && code == ExitCode::ok)
        restart =
            nlohmann::json::parse(world.broadcast_from_root(nlohmann::json(run.telemetry.straggler_move.blocks).dump()))
                .get<std::vector<int>>();
      return code;
    }
  }
  return finish(run, Ending{ExitCode::ok, "complete"}, std::max<int64_t>(first, spec.run.steps));
}

}  // namespace

ExitCode run_train(const TrainOptions& opt, World& world) {
  install_stop_handlers();            // idempotent; main installs them before MPI_Init already
  const double launched_s = now_s();  // run.time_limit counts from here, across in-process restarts
  double started_unix = process_started_unix();
  TrainOptions launch = opt;
  for (;;) {
    std::vector<int> restart;
    const ExitCode code = run_launch(launch, world, launched_s, started_unix, restart);
    started_unix = wall_clock_s();
    if (restart.empty()) return code;
    // The checkpoint just saved is this run's newest: the restart resumes from it on the new partition.
    launch.resume = ResumeFrom(ResumeMode::automatic);
    std::string list = blocks_text(restart);
    list.erase(std::remove(list.begin(), list.end(), ' '), list.end());
    launch.restart_overrides = {"parallel.partition=" + list};
    launch.restart_note = "restarted in-process on partition " + blocks_text(restart) +
                          " (log.straggler_action = rebalance; the stop record in events.jsonl says why)";
  }
}

}  // namespace pipetrain
