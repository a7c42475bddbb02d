// RUN_DIR/events.jsonl: the run's history across launches, one JSON object per line, appended by
// rank 0 and fsynced (a requeue script reads it right after the job step ends).
//
//   {"event": "launch", "launch": N, "time", "unix", "job_id", "restart_count", "hosts", "ranks",
//    "ranks_per_node", "threads_per_rank", "node_cores" (rank 0's node: may ranks outnumber cores?),
//    "layout": {"pp", "dp", "schedule", "virtual_stages"}, "version", "build", "resumed_from",
//    "last_logged_before" (the last step the launches before logged: beyond resumed_from they are
//    computed again),
//    "peak_gflops_per_core" or "peak_gflops_per_gpu", and under parallel.auto "layout_choice":
//    {"by", "summary", "reason", "costs"}, after an in-process restart "restart": why}
//   {"event": "stop", "launch": N, "time", "unix", "reason", "exit_code", "step", "signal",
//    "last_checkpoint", for a straggler_exclude stop "exclude_nodes": [node, ...], for a
//    straggler_rebalance one "partition": {"from", "to", "why"}}
//
// A launch is recorded once start-up succeeded on every rank; a stop when the run ends by its own
// decision (reason complete, signal, time_limit, bad_steps, failed_save, straggler_exclude) or
// restarts in-process (straggler_rebalance: the next launch record follows). A launch without a
// stop ended otherwise: a fault, a kill, a lost node. A fresh start sets the earlier history
// aside with the rest of the run directory; resuming the run's own checkpoints continues it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "pipetrain/train/run.hpp"

namespace pipetrain {

// Rank 0: appends the launch record and returns this launch's index (1 + the launches before).
// The previous launch's trace.json is kept as traces/launch_K.json first.
int record_launch(const Run& run);

// MFU's denominators of one core (gpu: one GPU) for products of `dtype`, as the first launch of the
// run with that model.dtype recorded them (a launch before peak_dtype was recorded: fp32); zeros if
// none did.
struct RecordedPeaks {
  double peak = 0, sgemm = 0;
  std::string basis;
};
RecordedPeaks recorded_peaks(const std::string& run_dir, bool gpu, Dtype dtype);

// Rank 0: appends the stop record of this launch.
void record_stop(const RunState& state, const std::string& reason, ExitCode code, int64_t step,
                 const nlohmann::json& extra = nlohmann::json::object());

}  // namespace pipetrain
