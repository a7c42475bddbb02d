// What Slurm's accounting says of a run's jobs: every start of each (a requeued job starts again
// under the same id; sacct --duplicates lists each start), with when it was queued, started and
// ended, for the goodput ledger's time outside pipetrain (tools/goodput_ledger).
#pragma once
#include <string>
#include <vector>

namespace pipetrain {

struct SlurmAttempt {
  std::string job_id, state;
  double submit = 0, start = 0, end = 0;  // Unix seconds (sacct gives whole seconds)
};

// Every start of `job_ids` that has started, by `sacct -D -X`, in start order. Empty, with `why`
// saying so, where sacct is missing, fails (no accounting storage: "Slurm accounting storage is
// disabled") or knows none of them. Bounded by a 10 s timeout.
std::vector<SlurmAttempt> job_attempts(const std::vector<std::string>& job_ids, std::string& why);

// One line of `sacct -P -o JobIDRaw,Submit,Start,End,State` ("12|2026-12-06T09:36:22|...|COMPLETED");
// false for one that is not (a header, a start still Unknown).
bool parse_attempt(const std::string& line, SlurmAttempt& out);

}  // namespace pipetrain
