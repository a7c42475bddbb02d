#pragma once
// Test-only fault hooks, read from the environment (never set in production; docs/testing.md).
// Each names a world rank and a 0-based step: PIPETRAIN_TEST_<HOOK>=RANK:STEP.
#include <cstdint>

namespace pipetrain {

// PIPETRAIN_TEST_STALL: that rank stops itself with SIGSTOP at the start of that step, so its
// peers' timeouts can be watched. Returns the step for this rank, or -1.
int test_stall_step(int rank);

// PIPETRAIN_TEST_NAN: a NaN goes into that rank's gradient in that step (RANK:STEP+: from that
// step on), in a tensor no other stage holds (the first element of wpe on the first stage, of
// the first tensor elsewhere).
bool test_nan_at(int rank, int64_t step);

// PIPETRAIN_TEST_KILL_IN_SAVE: that rank SIGKILLs itself halfway through writing its shard of
// checkpoint STEP. PIPETRAIN_TEST_KILL_IN_OPTIMIZER: halfway through its AdamW update of STEP.
bool test_kill_in_save(int rank, int64_t step);
bool test_kill_in_optimizer(int rank, int64_t step);

// PIPETRAIN_TEST_STALL_IN_SAVE: that rank stops itself with SIGSTOP before writing its shard of
// checkpoint STEP, while its peers wait for the save to be agreed.
bool test_stall_in_save(int rank, int64_t step);

// PIPETRAIN_TEST_HANG_IN_FINALIZE=RANK: that rank never returns from MPI_Finalize, as MPICH over
// UCX/TCP was seen to do with 3+ ranks; the finalize watchdog must end it.
bool test_hang_in_finalize(int rank);

}  // namespace pipetrain
