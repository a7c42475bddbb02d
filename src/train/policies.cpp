#include "pipetrain/train/policies.hpp"

namespace pipetrain {

bool eval_due(const RunSpec& spec, int done, bool stopping) {
  const int every = spec.eval.every_steps;
  const bool last = done == spec.run.steps;
  return every > 0 && (done % every == 0 || last) && !(stopping && !last);
}

bool log_due(const RunSpec& spec, int done, bool stopping, bool evaluated) {
  return done % spec.log.every_steps == 0 || done == spec.run.steps || stopping || evaluated;
}

bool save_due(const RunSpec& spec, int done, bool stopping) {
  const int every = spec.checkpoint.every_steps;
  return stopping || (done == spec.run.steps && spec.checkpoint.at_end) || (every > 0 && done % every == 0);
}

bool TimeBudget::nearly_out(double now_s, double step_s) const {
  const double worst_step = std::max(max_step_s_, step_s);
  return limit_s_ > 0 && now_s - launched_s_ + 1.5 * worst_step + 1.5 * max_save_s_ + 1.5 * max_eval_s_ >= limit_s_;
}

bool stop_after_failed_save(const RunSpec& spec, bool last_chance) {
  return last_chance || spec.checkpoint.on_error == OnSaveError::stop;
}

}  // namespace pipetrain
