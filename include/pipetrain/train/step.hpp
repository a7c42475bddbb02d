// One optimizer step of a run, and its log line.
#pragma once
#include <map>

#include "pipetrain/compute/profile.hpp"
#include "pipetrain/train/run.hpp"

namespace pipetrain {

struct StepResult {
  StepStats stats;  // the executor's: compute, waits, loss, activation peak
  StepSync sync;    // the step boundary's agreement: norm, stop, whether the update was applied
  double lr = 0;
  double step_s = 0;                      // wall time of the step
  double local_s = 0;                     // compute outside the executor (zeroing, norm, optimizer)
  double waited_s = 0;                    // all waits of the step, before any evaluation or save
  double dp_wait_s = 0;                   // of them, for the data-parallel exchanges
  double dp_comm_s = 0;                   // the exchanges' time on the link, hidden or not
  double gathered_bytes = 0;              // brought in by ZeRO's weight all-gathers (posted this step under ZeRO-1, 2)
  KernelTotals kernels;                   // this step's compute by kernel class
  std::map<int, MoeBlockFigures> routes;  // what its MoE blocks' routers did (model.moe)
};

// Step `step` (0-based): zero the gradients, run the schedule, agree at the step boundary, then
// AdamW, or nothing when any rank saw a NaN/Inf (counted in run.policies.bad_steps).
StepResult train_step(Run& run, int step);

// Every rank's figures for step `done` (1-based) gathered to rank 0, which writes the
// metrics.jsonl line and prints the progress line. val: not evaluated this step where val.loss < 0.
void log_step(Run& run, int done, const StepResult& result, const Validation& val);

}  // namespace pipetrain
