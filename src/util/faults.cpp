#include "pipetrain/util/faults.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace pipetrain {
namespace {

const char* const kVariables[] = {"PIPETRAIN_TEST_STALL",
                                  "PIPETRAIN_TEST_NAN",
                                  "PIPETRAIN_TEST_KILL_IN_OPTIMIZER",
                                  "PIPETRAIN_TEST_KILL_IN_SAVE",
                                  "PIPETRAIN_TEST_STALL_IN_SAVE",
                                  "PIPETRAIN_TEST_HANG_IN_FINALIZE",
                                  "PIPETRAIN_TEST_KILL_IN_SNAPSHOT",
                                  "PIPETRAIN_TEST_SLOW_COMPUTE"};
static_assert(sizeof kVariables / sizeof kVariables[0] == kFaultPoints);

}  // namespace

void FaultHooks::arm(int rank, const std::function<const char*(const char*)>& getenv) {
  for (int p = 0; p < kFaultPoints; ++p) {
    hooks_[p] = Hook{};
    const char* v = getenv(kVariables[p]);
    if (!v) continue;
    int r = -1;
    long long step = 0;
    char plus = 0;
    const bool rank_only = static_cast<FaultPoint>(p) == FaultPoint::hang_in_finalize;
    if (static_cast<FaultPoint>(p) == FaultPoint::slow_compute) {  // R:S:F, from step S on
      double factor = 0;
      if (std::sscanf(v, "%d:%lld:%lf", &r, &step, &factor) == 3 && r == rank && factor >= 1)
        hooks_[p] = Hook{step, true, factor};
      continue;
    }
    const int got = std::sscanf(v, rank_only ? "%d" : "%d:%lld%c", &r, &step, &plus);
    if (got < (rank_only ? 1 : 2) || r != rank) continue;
    hooks_[p] = Hook{rank_only ? 0 : step, plus == '+'};
  }
}

bool FaultHooks::fires(FaultPoint point, int64_t step) const {
  const Hook& h = hooks_[static_cast<int>(point)];
  if (point == FaultPoint::hang_in_finalize) return h.step >= 0;
  return h.step >= 0 && (h.from_on ? step >= h.step : step == h.step);
}

void FaultHooks::reach(FaultPoint point, int64_t step) const {
  if (!fires(point, step)) return;
  switch (point) {
    case FaultPoint::stall_at_step:
    case FaultPoint::stall_in_save:
      raise(SIGSTOP);
      break;
    case FaultPoint::kill_in_optimizer:
    case FaultPoint::kill_in_save:
    case FaultPoint::kill_in_snapshot:
      raise(SIGKILL);
      break;
    case FaultPoint::hang_in_finalize:
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    case FaultPoint::nan_in_gradient:
    case FaultPoint::slow_compute:
      break;  // the caller puts the NaN where it belongs, stretches its compute
  }
}

void test_pause(const char* where) {
  const char* v = std::getenv("PIPETRAIN_TEST_PAUSE");
  const size_t n = std::strlen(where);
  if (!v || std::strncmp(v, where, n) != 0 || v[n] != ':') return;
  const double seconds = std::atof(v + n + 1);
  std::fprintf(stderr, "pipetrain test hook: pausing %g s at %s\n", seconds, where);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

FaultHooks& fault_hooks() {
  static FaultHooks hooks;
  return hooks;
}

}  // namespace pipetrain
