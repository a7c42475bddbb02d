// The test-only fault hooks (util/faults.hpp): parsed once, aimed at one rank and one step.
#include <catch2/catch.hpp>

#include <map>

#include "pipetrain/util/faults.hpp"

using namespace pipetrain;

namespace {

FaultHooks armed(int rank, std::map<std::string, std::string> env) {
  FaultHooks hooks;
  hooks.arm(rank, [&](const char* name) { return env.count(name) ? env.at(name).c_str() : nullptr; });
  return hooks;
}

}  // namespace

TEST_CASE("fault hooks fire for their rank and step only", "[faults]") {
  const std::map<std::string, std::string> env = {{"PIPETRAIN_TEST_STALL", "1:7"},
                                                  {"PIPETRAIN_TEST_KILL_IN_SAVE", "1:20"},
                                                  {"PIPETRAIN_TEST_NAN", "1:3+"},
                                                  {"PIPETRAIN_TEST_HANG_IN_FINALIZE", "1"}};
  FaultHooks mine = armed(1, env), other = armed(0, env);
  mine.start_step(7);
  other.start_step(7);
  CHECK(mine.fires(FaultPoint::stall_at_step));
  CHECK_FALSE(other.fires(FaultPoint::stall_at_step));
  mine.start_step(6);
  CHECK_FALSE(mine.fires(FaultPoint::stall_at_step));
  CHECK(mine.fires(FaultPoint::kill_in_save, 20));  // saves name their checkpoint's step
  CHECK_FALSE(mine.fires(FaultPoint::kill_in_save, 10));
  CHECK_FALSE(mine.fires(FaultPoint::kill_in_optimizer));  // not set
  CHECK(mine.fires(FaultPoint::hang_in_finalize));
  CHECK_FALSE(other.fires(FaultPoint::hang_in_finalize));
  for (int step : {3, 4, 100}) CHECK(mine.fires(FaultPoint::nan_in_gradient, step));  // '+': from step 3 on
  CHECK_FALSE(mine.fires(FaultPoint::nan_in_gradient, 2));
}

TEST_CASE("fault hooks: nothing set, malformed values and an unarmed process fire nothing", "[faults]") {
  FaultHooks none = armed(0, {}), bad = armed(0, {{"PIPETRAIN_TEST_STALL", "zero:one"}});
  for (int step : {0, 1, 5}) {
    none.start_step(step);
    bad.start_step(step);
    CHECK_FALSE(none.fires(FaultPoint::stall_at_step));
    CHECK_FALSE(bad.fires(FaultPoint::stall_at_step));
  }
  FaultHooks unarmed;
  CHECK_FALSE(unarmed.fires(FaultPoint::hang_in_finalize));
  CHECK_FALSE(unarmed.fires(FaultPoint::kill_in_save, 0));
}

TEST_CASE("fault hooks: slow compute stretches one rank's compute from its step on", "[faults]") {
  const std::map<std::string, std::string> env = {{"PIPETRAIN_TEST_SLOW_COMPUTE", "2:5:1.5"}};
  FaultHooks mine = armed(2, env), other = armed(1, env), bad = armed(2, {{"PIPETRAIN_TEST_SLOW_COMPUTE", "2:5:0.5"}});
  for (int step : {0, 4}) {
    mine.start_step(step);
    CHECK(mine.compute_stretch() == 1.0);
  }
  for (int step : {5, 6, 300}) {
    mine.start_step(step);
    other.start_step(step);
    bad.start_step(step);
    CHECK(mine.compute_stretch() == 1.5);
    CHECK(other.compute_stretch() == 1.0);
    CHECK(bad.compute_stretch() == 1.0);  // a factor below 1 cannot speed a rank up: ignored
  }
}
