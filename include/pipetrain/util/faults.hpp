// Test-only fault hooks: named points in the code where a test can make one rank misbehave the
// way real failures do (stop answering, die, produce a NaN, hang). They are set through the
// environment, never in production (docs/testing.md), read once when the process's World starts,
// and checked where the failure belongs, so no production interface carries a test parameter.
//
//   PIPETRAIN_TEST_STALL=R:S              rank R stops (SIGSTOP) at the start of step S (0-based)
//   PIPETRAIN_TEST_NAN=R:S[+]             a NaN goes into rank R's gradient in step S (+: and after)
//   PIPETRAIN_TEST_KILL_IN_OPTIMIZER=R:S  rank R SIGKILLs itself halfway through AdamW in step S
//   PIPETRAIN_TEST_KILL_IN_SAVE=R:S       rank R SIGKILLs itself halfway through its shard of checkpoint S
//                                         (with checkpoint.async, on the background writer's thread)
//   PIPETRAIN_TEST_KILL_IN_SNAPSHOT=R:S   rank R SIGKILLs itself halfway through copying its part of
//                                         checkpoint S into the snapshot (checkpoint.async)
//   PIPETRAIN_TEST_STALL_IN_SAVE=R:S      rank R stops (SIGSTOP) before writing its shard of checkpoint S
//   PIPETRAIN_TEST_HANG_IN_FINALIZE=R     rank R never returns from MPI_Finalize (as MPICH/UCX did)
//   PIPETRAIN_TEST_SLOW_COMPUTE=R:S:F     from step S on, rank R's forwards and backwards take F times
//                                         as long on the clock they are timed with (it spins for the
//                                         rest, holding its core as a throttled CPU or GPU would)
//   PIPETRAIN_TEST_PAUSE=WHERE:SECONDS    every rank sleeps SECONDS at WHERE, saying so on stderr first,
//                                         so a drill can signal a launch there: `start` (before the
//                                         signal handlers and MPI: a slow node's program loading),
//                                         `resume` (a checkpoint chosen, not yet loaded), `exit` (the
//                                         launch's end recorded, the process not yet ended)
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace pipetrain {

enum class FaultPoint {
  stall_at_step,
  nan_in_gradient,
  kill_in_optimizer,
  kill_in_save,
  stall_in_save,
  hang_in_finalize,
  kill_in_snapshot,
  slow_compute
};
constexpr int kFaultPoints = 8;

class FaultHooks {
 public:
  // Reads the hooks aimed at `rank`; `getenv` is the environment (replaceable in tests).
  void arm(int rank, const std::function<const char*(const char*)>& getenv);
  // The training step now running (0-based): the step the in-step points compare against.
  void start_step(int64_t step) { step_ = step; }
  // Whether `point` is set for this rank at this step (the current one unless given: a save names
  // the step of its checkpoint).
  bool fires(FaultPoint point) const { return fires(point, step_); }
  bool fires(FaultPoint point, int64_t step) const;
  // Does what the point stands for (stop, die, hang) if it fires; nan_in_gradient only answers.
  void reach(FaultPoint point) const { reach(point, step_); }
  void reach(FaultPoint point, int64_t step) const;
  // slow_compute's factor at the current step: how many times as long this rank's compute is to
  // take (1 when the hook is not set or not yet due).
  double compute_stretch() const {
    return fires(FaultPoint::slow_compute) ? hooks_[static_cast<int>(FaultPoint::slow_compute)].factor : 1.0;
  }

 private:
  struct Hook {
    int64_t step = -1;  // -1: not set for this rank
    bool from_on = false;
    double factor = 1;  // slow_compute
  };
  Hook hooks_[kFaultPoints];
  int64_t step_ = -1;
};

// The process's hooks (armed by World at start; inert until then).
FaultHooks& fault_hooks();

// PIPETRAIN_TEST_PAUSE: sleeps here if it names `where` (read at each call: `start` comes before
// World arms the hooks).
void test_pause(const char* where);

}  // namespace pipetrain
