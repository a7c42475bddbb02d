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
// Where Slurm's accounting answers (tools/slurm_accounting), each start of the run's jobs adds
//   queue         submitted (or requeued) to started;
//   job script    started to the launch's process start, and the launch's end to the start's end
//                 (the script's checks, srun, a dead node's timeout, the requeue);
//   no launch     a start that ran no launch (one that requeued at once to grow, one that failed
//                 before its launch record);
// and the wall-clock runs from the first submission to the last end. Outside every start and
// launch (a run resubmitted later, launches without Slurm) is `between_s`. The parts sum to the
// wall-clock up to what the records cannot place (`unaccounted_s`: sacct's whole seconds, a clock
// that disagrees, a log written by an older pipetrain without totals).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipetrain/tools/slurm_accounting.hpp"

namespace pipetrain {

struct LedgerLaunch {
  int launch = 0;
  double start = 0, end = 0;  // Unix seconds
  bool stopped = false;       // it has a stop record (else its end is its last logged step)
  double startup_s = 0, training_s = 0, straggler_s = 0, lost_s = 0, checkpoint_s = 0, eval_s = 0, other_s = 0;
  int64_t lost_steps = 0;
  double queue_s = 0, script_s = 0;  // its Slurm start's (the first launch of a start has its queue)
  std::string job_id;                // "" where no Slurm start holds it
  double parts_s() const;            // the parts inside the launch
};

struct Ledger {
  std::vector<LedgerLaunch> launches;
  std::string slurm;         // where Slurm's times came from: "sacct", or why not
  int slurm_starts = 0;      // starts sacct listed
  int unlaunched = 0;        // of them, those that ran no launch
  int starts_lost = 0;       // starts that ran a launch but are missing from sacct's list
  double unlaunched_s = 0;   // their time from submission to end
  double wall_s = 0;         // first submission (or launch start) to the last end
  double between_s = 0;      // outside every start and launch, and between launches of one start
  double unaccounted_s = 0;  // wall_s less everything else
};

// `events`: events.jsonl's records in order; `metrics`: metrics.jsonl's lines; `straggler_ratio`:
// log.straggler_ratio (for logs whose windows carry no threshold); `attempts`: the starts of the
// run's jobs by sacct (empty: none known, `slurm` says why).
Ledger goodput_ledger(const std::vector<nlohmann::json>& events, const std::vector<nlohmann::json>& metrics,
                      double straggler_ratio, const std::vector<SlurmAttempt>& attempts = {},
                      const std::string& slurm = "no Slurm job");

nlohmann::json to_json(const Ledger& ledger);
std::string describe(const Ledger& ledger);  // report's lines ("" without launches)

}  // namespace pipetrain
