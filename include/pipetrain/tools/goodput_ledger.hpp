// The goodput ledger: where a run's wall-clock went, launch by launch, from what the run recorded
// (events.jsonl's launch and stop records, metrics.jsonl's "launch_totals" and straggler windows).
//
// A launch runs from its process start ("process_unix": an in-process restart's own start) to its
// stop record, or without one (a fault, a kill) to the last step it logged. Its time is split into
//   start-up      process start to the launch record (MPI, data, model, resume);
//   training      the steps whose work a checkpoint kept, less
//   stragglers    the time lost to stragglers in those steps (report's straggler section, per window);
//   lost          the steps a later launch computed again (past the checkpoint it resumed from);
//   checkpoints   the stalls of saves;
//   evaluation    validation passes;
//   other         the rest of the loop (logging, traces), what the three totals leave.
// Between launches (queue, job script, a lost node's timeout) is outside every launch. The parts
// sum to the wall-clock from the first launch's start to the last one's end, up to what the
// records cannot place (`unaccounted_s`: a clock that disagrees, a log written by an older
// pipetrain without totals).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace pipetrain {

struct LedgerLaunch {
  int launch = 0;
  double start = 0, end = 0;  // Unix seconds
  bool stopped = false;       // it has a stop record (else its end is its last logged step)
  double startup_s = 0, training_s = 0, straggler_s = 0, lost_s = 0, checkpoint_s = 0, eval_s = 0, other_s = 0;
  int64_t lost_steps = 0;
  double parts_s() const;
};

struct Ledger {
  std::vector<LedgerLaunch> launches;
  double wall_s = 0;         // the first launch's start to the last launch's end
  double between_s = 0;      // outside every launch
  double unaccounted_s = 0;  // wall_s less the parts and between_s
};

// `events`: events.jsonl's records in order; `metrics`: metrics.jsonl's lines; `straggler_ratio`:
// log.straggler_ratio (for logs whose windows carry no threshold).
Ledger goodput_ledger(const std::vector<nlohmann::json>& events, const std::vector<nlohmann::json>& metrics,
                      double straggler_ratio);

nlohmann::json to_json(const Ledger& ledger);
std::string describe(const Ledger& ledger);  // report's lines ("" without launches)

}  // namespace pipetrain
