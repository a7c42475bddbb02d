// Graceful stop: SIGUSR1 (Slurm's warning before the time limit), SIGTERM (preemption, scancel)
// and SIGINT (Ctrl-C, which reaches every rank) only set a flag; the training loop agrees on it across
// ranks at the next step boundary, saves a checkpoint and exits with code 3. Further signals during the save just set
// the flag again, except a second SIGINT, which ends the process at once with exit 130 (nothing saved is
// touched: a checkpoint is published only once whole). Each Ctrl-C is said in one line, by rank 0.
#pragma once

namespace pipetrain {

void install_stop_handlers();
// Whether this process says what a Ctrl-C does (rank 0; every process until the ranks are known).
void speak_on_signals(bool speaks_for_the_job);
bool stop_requested();
int stop_signal();  // the last signal received (0 if none)

}  // namespace pipetrain
