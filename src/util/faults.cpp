#include "pipetrain/util/faults.hpp"

#include <cstdio>
#include <cstdlib>

namespace pipetrain {
namespace {

// Parses NAME=RANK:STEP[+] for this rank: the step (-1 if unset or another rank's), and whether
// a '+' follows it.
int64_t hook_step(const char* name, int rank, bool* from_on = nullptr) {
  const char* v = std::getenv(name);
  int r = -1;
  long long step = -1;
  char plus = 0;
  if (!v || std::sscanf(v, "%d:%lld%c", &r, &step, &plus) < 2 || r != rank) return -1;
  if (from_on) *from_on = plus == '+';
  return step;
}

}  // namespace

int test_stall_step(int rank) { return static_cast<int>(hook_step("PIPETRAIN_TEST_STALL", rank)); }

bool test_nan_at(int rank, int64_t step) {
  bool from_on = false;
  const int64_t at = hook_step("PIPETRAIN_TEST_NAN", rank, &from_on);
  return at >= 0 && (from_on ? step >= at : step == at);
}

bool test_kill_in_save(int rank, int64_t step) { return hook_step("PIPETRAIN_TEST_KILL_IN_SAVE", rank) == step; }

bool test_stall_in_save(int rank, int64_t step) { return hook_step("PIPETRAIN_TEST_STALL_IN_SAVE", rank) == step; }

bool test_hang_in_finalize(int rank) {
  const char* v = std::getenv("PIPETRAIN_TEST_HANG_IN_FINALIZE");
  return v && std::atoi(v) == rank;
}

bool test_kill_in_optimizer(int rank, int64_t step) {
  return hook_step("PIPETRAIN_TEST_KILL_IN_OPTIMIZER", rank) == step;
}

}  // namespace pipetrain
