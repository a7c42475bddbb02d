// The training loop's decisions, each a small rule of the run spec: when to evaluate, log and
// save; how long a launch may go on (run.time_limit); when NaN steps stop the run
// (train.max_bad_steps); what a failed save does (checkpoint.on_error). Pure: every rank holds the
// same inputs, so every rank decides alike without a message.
#pragma once
#include <algorithm>

#include "pipetrain/config/spec.hpp"

namespace pipetrain {

// After step `done` (1-based) of the run; `stopping`: the ranks agreed to stop after this step.
bool eval_due(const RunSpec& spec, int done, bool stopping);  // not when stopping early: the save comes first
bool log_due(const RunSpec& spec, int done, bool stopping, bool evaluated);
bool save_due(const RunSpec& spec, int done, bool stopping);

// run.time_limit: a launch stops (with a checkpoint, exit 3) while one more step, a save and an
// evaluation still fit, each counted at 1.5 x the longest seen so far.
class TimeBudget {
 public:
  TimeBudget(double limit_s, double launched_s) : limit_s_(limit_s), launched_s_(launched_s) {}
  void step_took(double s) { max_step_s_ = std::max(max_step_s_, s); }
  void save_took(double s) {
    max_save_s_ = std::max(max_save_s_, s);
    saved_ = true;
  }
  void eval_took(double s) { max_eval_s_ = std::max(max_eval_s_, s); }
  // At `now_s`, in a step running for `step_s` so far: would another one overrun the limit?
  bool nearly_out(double now_s, double step_s) const;
  // How long a save's agreements may wait for the slowest shard writer: comm.timeout_s beyond 4x
  // the longest save so far; the first save keeps `first_save_s` (nothing is known yet).
  double save_agreement_s(double timeout_s, double first_save_s) const {
    return saved_ ? timeout_s + 4 * max_save_s_ : first_save_s;
  }

 private:
  double limit_s_, launched_s_;
  double max_step_s_ = 0, max_save_s_ = 1.0, max_eval_s_ = 0;  // 1 s: a save not yet seen
  bool saved_ = false;
};

// train.max_bad_steps: steps whose loss or gradient held a NaN/Inf are skipped; too many in a row
// stop the run.
class BadSteps {
 public:
  explicit BadSteps(int max_in_a_row) : max_(max_in_a_row) {}
  void record(bool applied) {
    if (applied) {
      in_a_row_ = 0;
    } else {
      ++in_a_row_;
      ++total_;
    }
  }
  int in_a_row() const { return in_a_row_; }
  int total() const { return total_; }  // in this launch
  bool too_many() const { return in_a_row_ >= max_; }

 private:
  int max_, in_a_row_ = 0, total_ = 0;
};

// checkpoint.on_error: a failed save the run can go on from (`last_chance` false: more saves
// follow) only under warn; the run's last save must succeed.
bool stop_after_failed_save(const RunSpec& spec, bool last_chance);

}  // namespace pipetrain
