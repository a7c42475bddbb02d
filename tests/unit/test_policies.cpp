// The training loop's decisions (train/policies.hpp): when to evaluate, log and save, the time
// budget, NaN steps in a row, and what a failed save does.
#include <catch2/catch.hpp>

#include "pipetrain/train/policies.hpp"

using namespace pipetrain;

namespace {

RunSpec spec_with(std::initializer_list<std::string> sets) { return parse_spec("", "", sets, 0); }

}  // namespace

TEST_CASE("policies: saves every N steps, at the end and when stopping", "[policies]") {
  const RunSpec spec = spec_with({"run.steps=25", "checkpoint.every_steps=10"});
  CHECK(save_due(spec, 10, false));
  CHECK(save_due(spec, 20, false));
  CHECK_FALSE(save_due(spec, 11, false));
  CHECK(save_due(spec, 25, false));  // the last step
  CHECK(save_due(spec, 13, true));   // a stop always saves
  const RunSpec only_end = spec_with({"run.steps=25", "checkpoint.every_steps=0"});
  CHECK_FALSE(save_due(only_end, 10, false));
  CHECK(save_due(only_end, 25, false));
  const RunSpec nothing_at_end = spec_with({"run.steps=25", "checkpoint.every_steps=0", "checkpoint.at_end=false"});
  CHECK_FALSE(save_due(nothing_at_end, 25, false));
  CHECK(save_due(nothing_at_end, 13, true));  // a stop still saves
  CHECK(save_due(spec_with({"run.steps=20", "checkpoint.every_steps=10", "checkpoint.at_end=false"}), 20, false));
}

TEST_CASE("policies: evaluation every N steps and at the end, but not when stopping early", "[policies]") {
  const RunSpec spec = spec_with({"run.steps=25", "eval.every_steps=10"});
  CHECK(eval_due(spec, 10, false));
  CHECK_FALSE(eval_due(spec, 10, true));  // a stop saves first; the checkpoint must not wait for eval
  CHECK(eval_due(spec, 25, true));        // the last step is evaluated even when a stop arrived
  CHECK_FALSE(eval_due(spec, 11, false));
  CHECK_FALSE(eval_due(spec_with({"run.steps=25"}), 25, false));  // eval.every_steps = 0: never
}

TEST_CASE("policies: a step is logged every N steps, at the end, when stopping and when evaluated", "[policies]") {
  const RunSpec spec = spec_with({"run.steps=25", "log.every_steps=5"});
  CHECK(log_due(spec, 5, false, false));
  CHECK_FALSE(log_due(spec, 6, false, false));
  CHECK(log_due(spec, 6, true, false));
  CHECK(log_due(spec, 7, false, true));
  CHECK(log_due(spec, 25, false, false));
}

TEST_CASE("policies: the time budget keeps room for 1.5x the longest step, save and evaluation", "[policies]") {
  TimeBudget none(0, 0);
  CHECK_FALSE(none.nearly_out(1e9, 1e9));  // run.time_limit = 0: no budget
  TimeBudget budget(100, 0);
  budget.step_took(10);
  // now + 1.5 x 10 (step) + 1.5 x 1 (a save not yet seen counts 1 s)
  CHECK_FALSE(budget.nearly_out(83, 5));
  CHECK(budget.nearly_out(84, 5));
  budget.save_took(4);
  CHECK(budget.nearly_out(80, 5));  // 80 + 15 + 6 >= 100
  budget.eval_took(2);
  CHECK(budget.nearly_out(77, 5));  // 77 + 15 + 6 + 3 >= 100
  CHECK_FALSE(budget.nearly_out(75, 5));
  CHECK(budget.nearly_out(60, 30));  // a step slower than any before counts as the longest
}

TEST_CASE("policies: a save's agreements allow comm.timeout_s + 4x the longest save, the first save more",
          "[policies]") {
  TimeBudget budget(0, 0);
  CHECK(budget.save_agreement_s(10, 600) == 600);
  budget.save_took(0.2);
  CHECK(budget.save_agreement_s(10, 600) == Approx(10 + 4 * 1.0));  // at least 1 s counted
  budget.save_took(3);
  CHECK(budget.save_agreement_s(10, 600) == Approx(10 + 4 * 3.0));
}

TEST_CASE("policies: NaN steps stop the run only after max_bad_steps in a row", "[policies]") {
  BadSteps bad(3);
  bad.record(false);
  bad.record(false);
  CHECK_FALSE(bad.too_many());
  bad.record(true);  // an applied update resets the streak
  CHECK(bad.in_a_row() == 0);
  CHECK(bad.total() == 2);
  bad.record(false);
  bad.record(false);
  bad.record(false);
  CHECK(bad.too_many());
  CHECK(bad.total() == 5);
}

TEST_CASE("policies: a failed save stops the run when it was the last one or on_error = stop", "[policies]") {
  const RunSpec warn = spec_with({}), stop = spec_with({"checkpoint.on_error=stop"});
  CHECK_FALSE(stop_after_failed_save(warn, false));
  CHECK(stop_after_failed_save(warn, true));
  CHECK(stop_after_failed_save(stop, false));
}
